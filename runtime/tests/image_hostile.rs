//! Hostile image sources and layers: members of a directory source that are symlinks out of
//! it, layers that cost too much (deep trees, data after the end of the archive), xattrs the
//! file system refuses, and hard links to files of lower layers. Each is either imported
//! correctly or refused with a clear error that leaves nothing behind in the store.

mod image_support;

use std::os::unix::fs::symlink;
use std::path::Path;

use image_support::{blob_files, store, LayerBuilder, TestImage};
use ironlet_runtime::image::{ImageError, ImageStore};

const SECRET: &[u8] = b"root:$6$host-secret-hash:19000:0:99999:7:::\n";

fn small_image() -> TestImage {
    TestImage::new(vec![LayerBuilder::new()
        .file("hello", b"hello\n", 0o644)
        .build()])
}

/// A host file outside every source, standing for /etc/shadow.
fn host_secret(tmp: &Path) -> std::path::PathBuf {
    let p = tmp.join("host-shadow");
    std::fs::write(&p, SECRET).unwrap();
    p
}

/// The import fails naming the member as leading outside, and the store is as it was.
fn assert_refused_outside(store: &ImageStore, source: &Path, member: &str) {
    let before = blob_files(store);
    let index = std::fs::read(store.root().join("index.json")).unwrap_or_default();
    let err = store.import(source).unwrap_err();
    assert!(
        matches!(err, ImageError::InvalidImage { .. }) && err.to_string().contains("outside"),
        "{member}: {err}"
    );
    assert!(err.to_string().contains(member), "{member}: {err}");
    let after = blob_files(store);
    assert!(
        after.iter().all(|(_, bytes)| bytes != SECRET),
        "{member}: the host file was copied into the blob store"
    );
    assert_eq!(after, before, "{member}: a failed import left blobs behind");
    assert_eq!(
        std::fs::read(store.root().join("index.json")).unwrap_or_default(),
        index
    );
}

#[test]
fn a_docker_dir_whose_layer_is_a_symlink_to_a_host_file_is_refused_without_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = host_secret(tmp.path());
    let (_d, store) = store();
    let img = small_image();
    let dir = img.write_docker_dir(&tmp.path().join("docker"), &["evil:1"]);
    let layer = dir.join(img.docker_layer_name(0));
    std::fs::remove_file(&layer).unwrap();
    symlink(&secret, &layer).unwrap();
    assert_refused_outside(&store, &dir, "layer.tar");
    // The same through a relative link climbing out.
    std::fs::remove_file(&layer).unwrap();
    symlink("../../host-shadow", &layer).unwrap();
    assert_refused_outside(&store, &dir, "layer.tar");
}

#[test]
fn a_docker_dir_whose_layer_directory_or_metadata_is_a_symlink_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = host_secret(tmp.path());
    let (_d, store) = store();
    let img = small_image();
    // The layer's parent directory leads out.
    let dir = img.write_docker_dir(&tmp.path().join("parent"), &["evil:1"]);
    let layer_dir = dir
        .join(img.docker_layer_name(0))
        .parent()
        .unwrap()
        .to_path_buf();
    let outside = tmp.path().join("outside-layer-dir");
    std::fs::create_dir(&outside).unwrap();
    std::fs::copy(&secret, outside.join("layer.tar")).unwrap();
    std::fs::remove_dir_all(&layer_dir).unwrap();
    symlink(&outside, &layer_dir).unwrap();
    assert_refused_outside(&store, &dir, "layer.tar");
    // manifest.json and the config lead out.
    for member in ["manifest.json".to_owned(), img.docker_config_name()] {
        let dir = img.write_docker_dir(&tmp.path().join(format!("m-{member}")), &["evil:1"]);
        std::fs::remove_file(dir.join(&member)).unwrap();
        symlink(&secret, dir.join(&member)).unwrap();
        assert_refused_outside(&store, &dir, &member);
    }
}

#[test]
fn an_oci_layout_whose_members_are_symlinks_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = host_secret(tmp.path());
    let (_d, store) = store();
    let img = small_image();
    for member in ["index.json", "oci-layout"] {
        let dir = img.write_layout(&tmp.path().join(format!("l-{member}")), Some("evil:1"));
        std::fs::remove_file(dir.join(member)).unwrap();
        symlink(&secret, dir.join(member)).unwrap();
        assert_refused_outside(&store, &dir, member);
    }
    // blobs/sha256 itself leads to a copy of the blobs outside.
    let dir = img.write_layout(&tmp.path().join("l-blobs"), Some("evil:1"));
    let outside = tmp.path().join("outside-blobs");
    std::fs::rename(dir.join("blobs/sha256"), &outside).unwrap();
    symlink(&outside, dir.join("blobs/sha256")).unwrap();
    assert_refused_outside(&store, &dir, "blobs/sha256");
}

#[test]
fn symlinks_that_stay_inside_a_source_directory_are_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = small_image();
    let dir = img.write_docker_dir(&tmp.path().join("docker"), &["inside:1"]);
    // Older `docker save` links duplicate layers to one copy.
    let layer = dir.join(img.docker_layer_name(0));
    std::fs::rename(&layer, dir.join("shared-layer.tar")).unwrap();
    symlink("../shared-layer.tar", &layer).unwrap();
    let images = store.import(&dir).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].id, img.id());
}

#[test]
fn a_fifo_member_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = small_image();
    let dir = img.write_layout(&tmp.path().join("fifo"), Some("fifo:1"));
    std::fs::remove_file(dir.join("index.json")).unwrap();
    let c = std::ffi::CString::new(dir.join("index.json").to_str().unwrap()).unwrap();
    // SAFETY: c is a valid path for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let err = store.import(&dir).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

#[test]
fn a_failed_import_leaves_no_blob_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let good = small_image();
    store
        .import(&good.write_layout(&tmp.path().join("good"), Some("good:1")))
        .unwrap();
    let before = blob_files(&store);
    // A layer whose diff_id is a lie: its (verified) blobs must not stay.
    let layer = LayerBuilder::new().file("f", b"lie", 0o644).build();
    let liar = TestImage::with_diff_ids(vec![layer], vec![image_support::sha256(b"other")]);
    let err = store
        .import(&liar.write_layout(&tmp.path().join("liar"), Some("liar:1")))
        .unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
    assert_eq!(blob_files(&store), before);
    assert_eq!(image_support::count(&store.root().join("ingest")), 0);
    // The good image is intact.
    assert_eq!(store.list_images().unwrap().len(), 1);
}

/// A layer `depth` directories deep (`d/d/…`), with a directory entry (mode 0750) every
/// `every` levels, a file `f` every 1 000 levels and `bottom` in the deepest directory.
fn deep_layer(depth: usize, every: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut path = String::new();
    for level in 1..=depth {
        path.push_str("d/");
        if level % every == 0 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o750);
            h.set_mtime(1_600_000_000 + level as u64);
            h.set_size(0);
            b.append_data(&mut h, &path, &[][..]).unwrap();
        }
        if level % 1000 == 0 || level == depth {
            let name = if level == depth { "bottom" } else { "f" };
            let data = format!("level {level}\n");
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, format!("{path}{name}"), data.as_bytes())
                .unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// Opens `name` in the directory `dir` through /proc (paths this deep exceed PATH_MAX).
fn open_in(dir: &std::fs::File, name: &str) -> std::fs::File {
    use std::os::fd::AsRawFd;
    std::fs::File::open(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Walks the deep tree of [`deep_layer`] in `fs` and checks every level.
fn assert_deep_tree(fs: &Path, depth: usize, every: usize) {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut dir = std::fs::File::open(fs).unwrap();
    for level in 1..=depth {
        dir = open_in(&dir, "d");
        let meta = dir.metadata().unwrap();
        if level % every == 0 {
            assert_eq!(meta.mode() & 0o7777, 0o750, "level {level}");
            assert_eq!(meta.mtime(), 1_600_000_000 + level as i64, "level {level}");
        }
        if level % 1000 == 0 || level == depth {
            let name = if level == depth { "bottom" } else { "f" };
            let mut s = String::new();
            open_in(&dir, name).read_to_string(&mut s).unwrap();
            assert_eq!(s, format!("level {level}\n"));
        }
    }
    // Nothing deeper.
    let entries: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        dir.as_raw_fd()
    }))
    .unwrap()
    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
    .collect();
    assert_eq!(entries, vec!["bottom"]);
}

/// The CPU time this thread spent in `work`: a complexity bound that a loaded machine
/// (other tests, other builds) does not stretch as it stretches wall time. An import runs
/// on its caller's thread.
fn cpu_time_of<T>(work: impl FnOnce() -> T) -> (T, std::time::Duration) {
    fn now() -> std::time::Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into `ts`.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime");
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
    let start = now();
    let out = work();
    (out, now().saturating_sub(start))
}

fn import_timed(store: &ImageStore, source: &Path) -> std::time::Duration {
    let ((), took) = cpu_time_of(|| {
        store.import(source).unwrap();
    });
    eprintln!("import of {} took {took:?} of CPU", source.display());
    took
}

fn snapshot_fs(store: &ImageStore, img: &TestImage) -> std::path::PathBuf {
    // One layer: its chain id is its diff_id.
    let diff_id = image_support::sha256(&img.layers[0]);
    store
        .root()
        .join("snapshots")
        .join(&diff_id["sha256:".len()..])
        .join("fs")
}

/// Complexity, not a benchmark: resolving every entry from the layer root made this
/// quadratic (and paths past PATH_MAX failed); the bound is generous for a debug build.
#[test]
fn a_ten_thousand_deep_layer_imports_in_linear_time_and_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = TestImage::new(vec![deep_layer(10_000, 10)]);
    let source = img.write_layout(&tmp.path().join("deep"), Some("deep:1"));
    let took = import_timed(&store, &source);
    assert!(took.as_secs() < 10, "import took {took:?}");
    assert_deep_tree(&snapshot_fs(&store, &img), 10_000, 10);
}

/// The hostile corpus's case: a directory entry at each of 2 000 levels (133 s before).
#[test]
fn a_layer_with_two_thousand_nested_directory_entries_imports_quickly() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = TestImage::new(vec![deep_layer(2_000, 1)]);
    let source = img.write_layout(&tmp.path().join("nested"), Some("nested:1"));
    let took = import_timed(&store, &source);
    assert!(took.as_secs() < 10, "import took {took:?}");
    assert_deep_tree(&snapshot_fs(&store, &img), 2_000, 1);
}

/// Removing a refused deep snapshot recursed once per level and overflowed the stack.
#[test]
fn a_refused_ten_thousand_deep_layer_is_removed_without_crashing() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = TestImage::with_diff_ids(
        vec![deep_layer(10_000, 100)],
        vec![image_support::sha256(b"a lie")],
    );
    let err = store
        .import(&img.write_layout(&tmp.path().join("deep-lie"), Some("lie:1")))
        .unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
    assert_eq!(image_support::count(&store.root().join("snapshots")), 0);
    assert!(blob_files(&store).is_empty());
}

/// `tar` followed by `mib` MiB of zeros, as gzip: one member per MiB of zeros (about 1 KB
/// each), so that gigabytes cost little to build.
fn gzip_with_trailing_zeros(tar: &[u8], mib: usize) -> Vec<u8> {
    let mut out = image_support::gzip(tar);
    let member = image_support::gzip(&vec![0u8; 1 << 20]);
    for _ in 0..mib {
        out.extend_from_slice(&member);
    }
    out
}

/// The diff_id of `tar` followed by `bytes` zeros (the whole uncompressed stream).
fn diff_id_with_zeros(tar: &[u8], bytes: usize) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(tar);
    let zeros = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len());
        h.update(&zeros[..n]);
        left -= n;
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

#[test]
fn record_padding_after_the_end_of_a_layer_is_hashed_into_its_diff_id_like_containerd() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let tar = LayerBuilder::new().file("f", b"padded", 0o644).build();
    // GNU tar pads to 10 KiB records; the diff_id covers the padding.
    let padded = [tar.clone(), vec![0u8; 10 << 10]].concat();
    let img = TestImage::new(vec![padded.clone()]);
    let gz = vec![image_support::gzip(&padded)];
    store
        .import(&img.write_layout_gz(&tmp.path().join("padded"), Some("padded:1"), &gz))
        .unwrap();
    // A diff_id of the archive alone (without what follows it) is refused.
    let img = TestImage::with_diff_ids(vec![padded], vec![image_support::sha256(&tar)]);
    let err = store
        .import(&img.write_layout_gz(&tmp.path().join("short"), Some("short:1"), &gz))
        .unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
}

#[test]
fn data_after_the_end_of_a_layer_is_refused_past_a_bound_without_decompressing_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let tar = LayerBuilder::new().file("f", b"x", 0o644).build();
    // 16 MiB after the end, with an honest diff_id: containerd would accept it after
    // decompressing everything; refused here, past 1 MiB.
    let mib = 16;
    let img =
        TestImage::with_diff_ids(vec![tar.clone()], vec![diff_id_with_zeros(&tar, mib << 20)]);
    let gz = vec![gzip_with_trailing_zeros(&tar, mib)];
    let err = store
        .import(&img.write_layout_gz(&tmp.path().join("trailing"), Some("t:1"), &gz))
        .unwrap_err();
    assert!(
        matches!(err, ImageError::TrailingData { limit, .. } if limit == 1 << 20),
        "{err}"
    );
    assert!(store.list_images().unwrap().is_empty());
    assert!(blob_files(&store).is_empty());
    // 10 GiB of zeros (10 MB of gzip) cost nothing: the stream is not read past the bound.
    let gz = vec![gzip_with_trailing_zeros(&tar, 10 << 10)];
    let img = TestImage::new(vec![tar]);
    let layout = img.write_layout_gz(&tmp.path().join("bomb"), Some("b:1"), &gz);
    let (err, took) = cpu_time_of(|| store.import(&layout).unwrap_err());
    assert!(matches!(err, ImageError::TrailingData { .. }), "{err}");
    assert!(took.as_secs() < 10, "import took {took:?}");
}

/// Layer 1 has usr/bin/tool (0750) in usr/bin (0711); layer 2 hard-links it from `link` (layer 2
/// itself has no usr/bin/tool); layer 2 also deletes etc/gone, which layer 3 links to.
fn lower_link_image(link: &str) -> TestImage {
    let l1 = LayerBuilder::new()
        .dir("usr/", 0o755)
        .dir("usr/bin/", 0o711)
        .raw(
            "usr/bin/tool",
            tar::EntryType::Regular,
            None,
            b"#!tool\n",
            0o750,
        )
        .file("etc/gone", b"gone\n", 0o644)
        .build();
    let l2 = LayerBuilder::new()
        .hardlink(link, "usr/bin/tool")
        .file("etc/.wh.gone", b"", 0o644)
        .build();
    TestImage::new(vec![l1, l2])
}

fn assert_linked_rootfs(rootfs: &Path, link: &str) {
    use std::os::unix::fs::MetadataExt;
    let tool = std::fs::metadata(rootfs.join("usr/bin/tool")).unwrap();
    let linked = std::fs::metadata(rootfs.join(link)).unwrap();
    assert_eq!(std::fs::read(rootfs.join(link)).unwrap(), b"#!tool\n");
    assert_eq!(
        std::fs::read(rootfs.join("usr/bin/tool")).unwrap(),
        b"#!tool\n"
    );
    assert_eq!((tool.dev(), tool.ino()), (linked.dev(), linked.ino()));
    assert_eq!(tool.nlink(), 2);
    assert_eq!(tool.mode() & 0o7777, 0o750);
    assert_eq!(tool.mtime(), 1_700_000_000);
    // The copied-up parent keeps the lower directory's mode.
    assert_eq!(
        std::fs::metadata(rootfs.join("usr/bin")).unwrap().mode() & 0o7777,
        0o711
    );
}

/// containerd applies a layer onto a mount of its parents, so a hard link to a file of a
/// lower layer works: the file is copied up into the layer's snapshot, then linked.
#[test]
fn a_hard_link_to_a_file_of_a_lower_layer_is_imported_and_both_names_share_it() {
    use ironlet_runtime::image::RootfsMode;
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    for (n, link) in ["usr/bin/alias", "elsewhere/deep/alias"].iter().enumerate() {
        let img = lower_link_image(link);
        let source = img.write_layout(&tmp.path().join(format!("l{n}")), Some("links:1"));
        store.import(&source).unwrap();
        let mut modes = vec![RootfsMode::Copy];
        if store.config().privileged {
            modes.push(RootfsMode::Overlay);
        }
        for mode in modes {
            let target = tmp.path().join(format!("bundle-{n}-{mode:?}"));
            let prepared = store.prepare_rootfs(&img.id(), &target, mode).unwrap();
            assert_linked_rootfs(&prepared.rootfs, link);
            store.release_rootfs(&target).unwrap();
        }
    }
}

/// The lower file must be visible in the merged view: deleted by a whiteout, or never
/// there, the link is refused as before.
#[test]
fn a_hard_link_to_a_deleted_or_absent_lower_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let base = lower_link_image("usr/bin/alias");
    for (n, target) in ["etc/gone", "etc/never", "usr/bin"].iter().enumerate() {
        let l3 = LayerBuilder::new().hardlink("etc/link", target).build();
        let img = TestImage::new([base.layers.clone(), vec![l3]].concat());
        let err = store
            .import(&img.write_layout(&tmp.path().join(format!("r{n}")), Some("r:1")))
            .unwrap_err();
        assert!(
            matches!(err, ImageError::UnsafeEntry { ref entry, .. } if entry == "etc/link"),
            "{target}: {err}"
        );
        assert!(store.list_images().unwrap().is_empty());
    }
}

/// JSON nested 100 000 deep in index.json, manifest.json or a config is refused with a
/// parse error (serde_json's recursion limit), never a stack overflow.
#[test]
fn deeply_nested_json_is_refused_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let img = small_image();
    let layout = img.write_layout(&tmp.path().join("deep-index"), Some("d:1"));
    let index = format!(r#"{{"schemaVersion":2,"manifests":{}}}"#, deep(100_000));
    std::fs::write(layout.join("index.json"), index).unwrap();
    let err = store.import(&layout).unwrap_err();
    assert!(matches!(err, ImageError::Json { .. }), "{err}");
    let dir = img.write_docker_dir(&tmp.path().join("deep-docker"), &["d:1"]);
    std::fs::write(dir.join("manifest.json"), deep(100_000)).unwrap();
    let err = store.import(&dir).unwrap_err();
    assert!(matches!(err, ImageError::Json { .. }), "{err}");
    // A config nested deep: its digest is honest, its content is not an image config.
    let config = format!(
        r#"{{"rootfs":{{"diff_ids":[]}},"config":{}}}"#,
        deep(100_000)
    );
    let mut liar = img.clone();
    liar.config = config.into_bytes();
    let err = store
        .import(&liar.write_docker_archive(&tmp.path().join("deep-config.tar"), &["d:1"]))
        .unwrap_err();
    assert!(matches!(err, ImageError::Json { .. }), "{err}");
    assert!(store.list_images().unwrap().is_empty());
    assert!(blob_files(&store).is_empty());
}

/// Copy mode (rootless, or no overlayfs) recursed once per level and overflowed the stack
/// on a deep layer: it now refuses trees deeper than it can copy, cleanly.
#[test]
fn copy_mode_refuses_a_ten_thousand_deep_layer_cleanly() {
    use ironlet_runtime::image::RootfsMode;
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let img = TestImage::new(vec![deep_layer(10_000, 100)]);
    store
        .import(&img.write_layout(&tmp.path().join("deep"), Some("deep:1")))
        .unwrap();
    let target = tmp.path().join("bundle");
    let err = store
        .prepare_rootfs(&img.id(), &target, RootfsMode::Copy)
        .unwrap_err();
    assert!(
        err.to_string().contains("copy mode cannot copy it"),
        "{err}"
    );
    store.release_rootfs(&target).unwrap();
    assert!(!target.join("rootfs").exists());
}

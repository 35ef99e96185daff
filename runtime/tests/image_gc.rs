//! Garbage collection: unreferenced blobs and snapshots go; those of tagged images and of
//! leased (prepared) root file systems stay; gc never races an import in flight.

mod image_support;

use std::collections::BTreeSet;
use std::path::Path;

use image_support::{store, LayerBuilder, TestImage};
use ironlet_runtime::image::{ImageStore, ImageStoreConfig, RootfsMode};

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn blobs(store: &ImageStore) -> BTreeSet<String> {
    names(&store.root().join("blobs/sha256"))
}

fn snapshots(store: &ImageStore) -> BTreeSet<String> {
    names(&store.root().join("snapshots"))
}

/// Two images sharing their base layer.
fn two_images() -> (TestImage, TestImage) {
    let base = LayerBuilder::new().file("base", b"shared", 0o644).build();
    let a = TestImage::new(vec![
        base.clone(),
        LayerBuilder::new().file("a", b"only a", 0o644).build(),
    ]);
    let b = TestImage::new(vec![
        base,
        LayerBuilder::new().file("b", b"only b", 0o644).build(),
    ]);
    (a, b)
}

#[test]
fn gc_removes_what_no_tag_references_and_keeps_what_tagged_images_share() {
    let tmp = tempfile::tempdir().unwrap();
    let (store_dir, store) = store();
    let (a, b) = two_images();
    store
        .import(&a.write_layout(&tmp.path().join("a"), Some("a:1")))
        .unwrap();
    let only_a_blobs = blobs(&store);
    let only_a_snapshots = snapshots(&store);
    store
        .import(&b.write_layout(&tmp.path().join("b"), Some("b:1")))
        .unwrap();
    assert_eq!(snapshots(&store).len(), 3, "base shared, two tops");
    assert_eq!(
        store.gc().unwrap().blobs_removed,
        0,
        "everything is referenced"
    );

    let full = store.image_stats().unwrap().total_storage_bytes;
    assert!(store.remove_image("b:1").unwrap());
    let report = store.gc().unwrap();
    assert_eq!(
        report.blobs_removed, 3,
        "b's manifest, config and top layer"
    );
    assert_eq!(report.snapshots_removed, 1);
    assert!(report.bytes_freed > 0);
    assert_eq!(blobs(&store), only_a_blobs);
    assert_eq!(snapshots(&store), only_a_snapshots);
    assert!(store.image_stats().unwrap().total_storage_bytes < full);
    assert!(store.get_image("a:1").unwrap().is_some());

    assert!(store.remove_image("a:1").unwrap());
    store.gc().unwrap();
    assert!(blobs(&store).is_empty());
    assert!(snapshots(&store).is_empty());
    drop(store_dir);
}

#[test]
fn gc_keeps_the_snapshots_of_a_prepared_rootfs_until_it_is_released() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let (a, _) = two_images();
    store
        .import(&a.write_layout(&tmp.path().join("a"), Some("a:1")))
        .unwrap();
    let leased = snapshots(&store);
    let mode = if image_support_is_root() {
        RootfsMode::Overlay
    } else {
        RootfsMode::Copy
    };
    let target = tmp.path().join("bundle");
    let prepared = store.prepare_rootfs("a:1", &target, mode).unwrap();
    assert!(store.remove_image("a:1").unwrap());
    let report = store.gc().unwrap();
    assert_eq!(report.blobs_removed, 4, "manifest, config, two layers");
    assert_eq!(report.snapshots_removed, 0);
    assert_eq!(snapshots(&store), leased);
    assert_eq!(std::fs::read(prepared.rootfs.join("a")).unwrap(), b"only a");

    store.release_rootfs(&target).unwrap();
    assert_eq!(store.gc().unwrap().snapshots_removed, 2);
    assert!(snapshots(&store).is_empty());
}

#[test]
fn gc_drops_the_lease_of_a_rootfs_whose_directory_vanished() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let (a, _) = two_images();
    store
        .import(&a.write_layout(&tmp.path().join("a"), Some("a:1")))
        .unwrap();
    let target = tmp.path().join("bundle");
    store
        .prepare_rootfs("a:1", &target, RootfsMode::Copy)
        .unwrap();
    std::fs::remove_dir_all(&target).unwrap();
    store.remove_image("a:1").unwrap();
    assert_eq!(store.gc().unwrap().snapshots_removed, 2);
    assert!(names(&store.root().join("leases")).is_empty());
}

#[test]
fn gc_running_alongside_imports_from_another_store_handle_never_loses_their_content() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let config = ImageStoreConfig {
        sync_snapshots: false,
        ..Default::default()
    };
    // Two handles on one root, as the CLI and the agent would have.
    let importer = ImageStore::open_with(&root, config.clone()).unwrap();
    let collector = ImageStore::open_with(&root, config).unwrap();
    let images: Vec<TestImage> = (0..6u8)
        .map(|i| {
            TestImage::new(vec![
                LayerBuilder::new().file("f", &[i; 4096], 0o644).build(),
                LayerBuilder::new().file("g", &[i; 16], 0o644).build(),
            ])
        })
        .collect();
    let archives: Vec<_> = images
        .iter()
        .enumerate()
        .map(|(i, img)| {
            img.write_oci_archive(&tmp.path().join(format!("i{i}.oci.tar")), Some("latest"))
        })
        .collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                collector.gc().unwrap();
            }
        });
        for a in &archives {
            importer.import(a).unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    collector.gc().unwrap();
    for (i, img) in images.iter().enumerate() {
        let target = tmp.path().join(format!("bundle{i}"));
        let prepared = collector
            .prepare_rootfs(&img.id(), &target, RootfsMode::Copy)
            .unwrap();
        assert_eq!(
            std::fs::read(prepared.rootfs.join("g")).unwrap(),
            [i as u8; 16]
        );
        collector.release_rootfs(&target).unwrap();
    }
}

fn image_support_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

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

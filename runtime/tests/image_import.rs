//! Import of the three image forms, naming, lookup, removal and refusal of bad content.

mod image_support;

use std::time::Duration;

use image_support::{layered_image, sha256, store, LayerBuilder, TestImage};
use ironlet_runtime::image::{ImageError, ImageStore, LocalImageService};
use ironlet_runtime::ImageService;

fn index_bytes(store: &ImageStore) -> Vec<u8> {
    std::fs::read(store.root().join("index.json")).unwrap_or_default()
}

fn small_image(tag: &[u8]) -> TestImage {
    TestImage::new(vec![LayerBuilder::new().file("hello", tag, 0o644).build()])
}

#[test]
fn the_same_image_has_the_same_id_from_a_layout_an_oci_archive_and_a_docker_archive() {
    let img = layered_image();
    let tmp = tempfile::tempdir().unwrap();
    let layout = img.write_layout(&tmp.path().join("layered"), Some("latest"));
    let oci = img.write_oci_archive(&tmp.path().join("layered.oci.tar"), Some("v1"));
    let docker = img.write_docker_archive(&tmp.path().join("x.docker.tar"), &["layered:docker"]);

    let (_d, store) = store();
    let from_layout = store.import(&layout).unwrap();
    let from_oci = store.import(&oci).unwrap();
    let from_docker = store.import(&docker).unwrap();
    for imported in [&from_layout, &from_oci, &from_docker] {
        assert_eq!(imported.len(), 1);
        assert_eq!(imported[0].id, img.id());
    }

    let all = store.list_images().unwrap();
    assert_eq!(all.len(), 1, "one id, one image: {all:?}");
    assert_eq!(
        all[0].repo_tags,
        vec![
            "docker.io/library/layered:docker",
            "docker.io/library/layered:latest",
            "docker.io/library/layered:v1",
        ]
    );
    assert_eq!(all[0].config.entrypoint, vec!["/bin/tool"]);
    assert_eq!(all[0].config.working_dir.as_deref(), Some("/work"));
    // The docker-archive was converted to an OCI manifest of its own (uncompressed layers).
    assert_eq!(all[0].repo_digests.len(), 2, "{:?}", all[0].repo_digests);
}

#[test]
fn reimporting_an_image_changes_nothing() {
    let img = layered_image();
    let tmp = tempfile::tempdir().unwrap();
    let archive = img.write_oci_archive(&tmp.path().join("layered.oci.tar"), Some("latest"));
    let (_d, store) = store();
    store.import(&archive).unwrap();
    let index = index_bytes(&store);
    let blobs = image_support::tree(&store.root().join("blobs"));
    let snapshots = image_support::count(&store.root().join("snapshots"));
    store.import(&archive).unwrap();
    assert_eq!(index_bytes(&store), index);
    assert_eq!(image_support::tree(&store.root().join("blobs")), blobs);
    assert_eq!(
        image_support::count(&store.root().join("snapshots")),
        snapshots
    );
    assert_eq!(snapshots, 3);
}

#[test]
fn a_corrupt_blob_is_rejected_and_the_index_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    store
        .import(&small_image(b"a").write_layout(&tmp.path().join("a"), Some("a:1")))
        .unwrap();
    let before = index_bytes(&store);

    let img = small_image(b"b");
    let layout = img.write_layout(&tmp.path().join("b"), Some("b:1"));
    let layer = sha256(&image_support::gzip(&img.layers[0]));
    let blob = layout.join("blobs/sha256").join(&layer["sha256:".len()..]);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let err = store.import(&layout).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains(&layer),
        "error names the blob: {err}"
    );
    assert_eq!(index_bytes(&store), before);

    // The same corrupt blob inside an archive is refused too.
    let archive = tmp.path().join("b.oci.tar");
    image_support::tar_dir(&layout, &archive);
    let err = store.import(&archive).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert_eq!(index_bytes(&store), before);
    assert!(store.get_image("b:1").unwrap().is_none());
}

#[test]
fn a_corrupt_copy_of_an_image_already_in_the_store_is_still_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let img = small_image(b"same");
    let good = img.write_layout(&tmp.path().join("good"), Some("x:1"));
    let (_d, store) = store();
    store.import(&good).unwrap();
    let bad = img.write_layout(&tmp.path().join("bad"), Some("x:2"));
    let config = bad.join("blobs/sha256").join(&img.id()["sha256:".len()..]);
    std::fs::write(&config, b"{}").unwrap();
    let before = index_bytes(&store);
    let err = store.import(&bad).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert_eq!(index_bytes(&store), before);
}

#[test]
fn a_missing_blob_is_rejected_and_the_index_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let img = small_image(b"m");
    let layout = img.write_layout(&tmp.path().join("m"), Some("m:1"));
    let layer = sha256(&image_support::gzip(&img.layers[0]));
    std::fs::remove_file(layout.join("blobs/sha256").join(&layer["sha256:".len()..])).unwrap();
    let (_d, store) = store();
    let err = store.import(&layout).unwrap_err();
    assert!(
        matches!(err, ImageError::BlobMissing { ref digest, .. } if digest == &layer),
        "{err}"
    );
    assert!(index_bytes(&store).is_empty() || store.list_images().unwrap().is_empty());
}

#[test]
fn a_layer_that_does_not_match_its_diff_id_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = LayerBuilder::new().file("f", b"x", 0o644).build();
    let img = TestImage::with_diff_ids(vec![layer], vec![sha256(b"something else")]);
    let (_d, store) = store();
    let err = store
        .import(&img.write_layout(&tmp.path().join("d"), Some("d:1")))
        .unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
    assert!(store.list_images().unwrap().is_empty());
    // Nothing half-unpacked is left as a snapshot.
    assert_eq!(image_support::count(&store.root().join("snapshots")), 0);
    // The docker-archive form is checked before unpacking (uncompressed blob = diff_id).
    let err = store
        .import(&img.write_docker_archive(&tmp.path().join("d.tar"), &["d:1"]))
        .unwrap_err();
    assert!(matches!(err, ImageError::DiffIdMismatch { .. }), "{err}");
}

#[test]
fn a_tag_only_ref_name_is_qualified_with_the_layout_name_and_lookups_normalise() {
    let tmp = tempfile::tempdir().unwrap();
    let img = small_image(b"bb");
    let (_d, store) = store();
    store
        .import(&img.write_layout(&tmp.path().join("busybox"), Some("latest")))
        .unwrap();
    let id = img.id();
    for name in [
        "busybox",
        "busybox:latest",
        "docker.io/library/busybox:latest",
        "index.docker.io/library/busybox",
        id.as_str(),
        &id["sha256:".len()..],
        &id["sha256:".len().."sha256:".len() + 12],
        &id[.."sha256:".len() + 12],
    ] {
        let found = store.get_image(name).unwrap();
        assert_eq!(found.map(|i| i.id), Some(id.clone()), "lookup of {name}");
    }
    assert!(store.get_image("busybox:other").unwrap().is_none());
    assert!(store.get_image("otherbox").unwrap().is_none());
    let manifest_ref = store.get_image("busybox").unwrap().unwrap().repo_digests[0].clone();
    assert!(manifest_ref.starts_with("docker.io/library/busybox@sha256:"));
    assert_eq!(store.get_image(&manifest_ref).unwrap().unwrap().id, id);
}

#[test]
fn an_invalid_reference_is_refused_with_the_kubelet_reason_invalid_image_name() {
    let (_d, store) = store();
    for bad in ["UPPER", "busybox:", "a//b", "sha256:xyz"] {
        let err = store.get_image(bad).unwrap_err();
        assert_eq!(err.kubelet_reason(), "InvalidImageName", "{bad}: {err}");
    }
}

#[test]
fn an_id_prefix_shorter_than_twelve_is_refused_and_untagged_images_are_found_by_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let mut ids = Vec::new();
    // Import images until two ids share their first hex character.
    for i in 0..40u8 {
        let img = small_image(&[i]);
        store
            .import(&img.write_layout(&tmp.path().join(format!("i{i}")), None))
            .unwrap();
        ids.push(img.id()["sha256:".len()..].to_owned());
        let first: Vec<char> = ids.iter().map(|h| h.chars().next().unwrap()).collect();
        if let Some(c) = first
            .iter()
            .find(|c| first.iter().filter(|d| d == c).count() > 1)
        {
            let err = store.get_image(&format!("sha256:{c}")).unwrap_err();
            assert_eq!(err.kubelet_reason(), "InvalidImageName", "too short: {err}");
            // Untagged images are listed and found by id.
            assert_eq!(store.list_images().unwrap().len(), ids.len());
            let twelve: Vec<&String> = ids.iter().filter(|h| h.starts_with(*c)).collect();
            assert!(store.get_image(&twelve[0][..12]).unwrap().is_some());
            return;
        }
    }
    panic!("no two of 40 ids share a first hex digit");
}

#[test]
fn removing_the_last_tag_drops_the_image_and_removing_by_id_drops_all_tags() {
    let tmp = tempfile::tempdir().unwrap();
    let img = small_image(b"r");
    let (_d, store) = store();
    store
        .import(&img.write_docker_archive(&tmp.path().join("r.tar"), &["r:1", "r:2"]))
        .unwrap();
    assert!(store.remove_image("r:1").unwrap());
    assert_eq!(
        store.get_image("r:2").unwrap().unwrap().repo_tags,
        vec!["docker.io/library/r:2"]
    );
    assert!(store.remove_image("r:2").unwrap());
    assert!(store.list_images().unwrap().is_empty());
    assert!(!store.remove_image("r:2").unwrap());

    store
        .import(&img.write_docker_archive(&tmp.path().join("r.tar"), &["r:1", "r:2"]))
        .unwrap();
    assert!(store.remove_image(&img.id()).unwrap());
    assert!(store.list_images().unwrap().is_empty());
}

#[test]
fn a_file_that_is_no_image_is_an_unknown_format() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.tar");
    image_support::tar_dir(tmp.path(), &path);
    let (_d, store) = store();
    let err = store.import(&path).unwrap_err();
    assert!(matches!(err, ImageError::UnknownFormat { .. }), "{err}");
}

#[test]
fn the_async_service_imports_lists_and_removes_with_space_given_back() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let tmp = tempfile::tempdir().unwrap();
            let (_d, store) = store();
            let svc = LocalImageService::new(std::sync::Arc::new(store));
            let img = layered_image();
            let path = img.write_oci_archive(&tmp.path().join("svc.oci.tar"), Some("svc:1"));
            let imported = svc.import(&path).await.unwrap();
            assert_eq!(imported[0].repo_tags, vec!["docker.io/library/svc:1"]);
            assert_eq!(svc.list_images().await.unwrap().len(), 1);
            let full = svc.image_stats().await.unwrap().total_storage_bytes;
            assert!(full > 0);
            svc.remove_image("svc:1").await.unwrap();
            svc.remove_image("svc:1").await.unwrap();
            assert!(svc.get_image("svc:1").await.unwrap().is_none());
            let empty = svc.image_stats().await.unwrap().total_storage_bytes;
            assert!(empty < full, "remove gives space back: {empty} < {full}");
            assert_eq!(
                image_support::count(&svc.store().root().join("blobs/sha256")),
                0
            );
        })
        .await
        .expect("the image service deadlocked (gc lock held by an import?)");
    });
}

#[test]
fn a_pin_is_listed_on_every_tag_of_the_image_and_goes_with_the_image() {
    let img = layered_image();
    let tmp = tempfile::tempdir().unwrap();
    let layout = img.write_layout(&tmp.path().join("layered"), Some("latest"));
    let (_d, store) = store();
    store.import(&layout).unwrap();
    assert!(!store.get_image("layered").unwrap().unwrap().pinned);
    assert!(store.set_pinned("layered", true).unwrap());
    assert!(!store.set_pinned("absent:1", true).unwrap());
    let by_id = store.get_image(&img.id()).unwrap().unwrap();
    assert!(by_id.pinned, "the pin is the image's, whatever names it");
    assert!(store.set_pinned(&img.id(), false).unwrap());
    assert!(!store.get_image("layered").unwrap().unwrap().pinned);

    // Removing the image drops its pin: a later import of it is not pinned.
    store.set_pinned("layered", true).unwrap();
    store.remove_image(&img.id()).unwrap();
    store.import(&layout).unwrap();
    assert!(!store.get_image("layered").unwrap().unwrap().pinned);
    // So does removing its last tag.
    store.set_pinned("layered", true).unwrap();
    store.remove_image("layered").unwrap();
    store.import(&layout).unwrap();
    assert!(!store.get_image("layered").unwrap().unwrap().pinned);
}

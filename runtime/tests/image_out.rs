//! The project's test images (`images/out`, made by `images/build`) in all three forms:
//! each imports with one id, and the layered image gives the same tree through overlay and
//! copy, with no whiteout left visible.
//!
//! If `images/out` is missing it is built first with `images/build` (a deterministic local
//! script); if that script does not exist yet, the test says so and passes.

mod image_support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use image_support::{store, tree};
use ironlet_runtime::image::RootfsMode;

const IMAGES: [&str; 2] = ["busybox", "layered"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the runtime crate sits in the workspace")
        .to_path_buf()
}

/// The three forms of `name` that exist under `out`.
fn forms(out: &Path, name: &str) -> Vec<PathBuf> {
    [
        out.join(name),
        out.join(format!("{name}.oci.tar")),
        out.join(format!("{name}.docker.tar")),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect()
}

/// `images/out`, built if needed; `None` when there is no build script yet.
fn images_out() -> Option<PathBuf> {
    let root = repo_root();
    let out = root.join("images/out");
    if IMAGES.iter().all(|n| forms(&out, n).len() == 3) {
        return Some(out);
    }
    let build = root.join("images/build");
    if !build.exists() {
        eprintln!("skipped: images/out is missing and images/build does not exist yet");
        return None;
    }
    let status = std::process::Command::new(&build)
        .current_dir(root.join("images"))
        .status()
        .expect("run images/build");
    assert!(status.success(), "images/build failed: {status}");
    Some(out)
}

#[test]
fn every_form_of_the_project_images_imports_with_one_id() {
    let Some(out) = images_out() else { return };
    for name in IMAGES {
        let paths = forms(&out, name);
        assert_eq!(
            paths.len(),
            3,
            "{name}: expected layout, .oci.tar and .docker.tar in {out:?}"
        );
        let (_d, store) = store();
        let mut ids = Vec::new();
        for p in &paths {
            let imported = store
                .import(p)
                .unwrap_or_else(|e| panic!("importing {p:?}: {e}"));
            assert_eq!(imported.len(), 1, "{p:?}");
            ids.push(imported[0].id.clone());
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "{name}: one id from all forms");
        let image = store.get_image(name).unwrap().unwrap_or_else(|| {
            panic!(
                "{name} is not found by its short name: {:?}",
                store.list_images()
            )
        });
        assert!(
            image
                .repo_tags
                .iter()
                .any(|t| t.starts_with(&format!("docker.io/library/{name}:"))),
            "{:?}",
            image.repo_tags
        );
        // Importing the last form again changes nothing (each form has its own manifest
        // digest: a docker-archive's layers are uncompressed).
        let index = std::fs::read(store.root().join("index.json")).unwrap();
        store.import(&paths[paths.len() - 1]).unwrap();
        assert_eq!(
            std::fs::read(store.root().join("index.json")).unwrap(),
            index
        );
    }
}

#[test]
fn the_layered_project_image_has_the_same_tree_through_overlay_and_copy() {
    let Some(out) = images_out() else { return };
    let (_d, store) = store();
    store.import(&out.join("layered")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let copy_target = tmp.path().join("copy");
    let copied = store
        .prepare_rootfs("layered", &copy_target, RootfsMode::Copy)
        .unwrap();
    let copy_tree = tree(&copied.rootfs);
    assert!(!copy_tree.is_empty());
    assert!(
        copy_tree
            .iter()
            .all(|p| !p.rsplit('/').next().unwrap_or("").starts_with(".wh.")),
        "whiteout files are never visible"
    );
    let is_root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if is_root {
        let overlay_target = tmp.path().join("overlay");
        let mounted = store
            .prepare_rootfs("layered", &overlay_target, RootfsMode::Overlay)
            .unwrap();
        assert_eq!(tree(&mounted.rootfs), copy_tree);
        store.release_rootfs(&overlay_target).unwrap();
    }
    store.release_rootfs(&copy_target).unwrap();
}

//! Layer tars: unpacked with `unpack_layer` (overlay whiteouts as root, recorded ones
//! otherwise) into a fresh scratch directory that has a canary file beside it; afterwards
//! the canary must be intact and nothing else may have appeared beside the target.
#![no_main]

use ironlet_runtime::image::{unpack_layer, UnpackLimits, UnpackOptions, WhiteoutFormat};
use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"canary\n";

fuzz_target!(|data: &[u8]| {
    let scratch = tempfile::tempdir().expect("temp dir");
    let target = scratch.path().join("target");
    let canary = scratch.path().join("canary");
    std::fs::create_dir(&target).expect("target dir");
    std::fs::write(&canary, CANARY).expect("canary");
    let root = is_root();
    let opts = UnpackOptions {
        limits: UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 1000,
        },
        whiteouts: if root {
            WhiteoutFormat::Overlay
        } else {
            WhiteoutFormat::Sidecar
        },
        preserve_owner: root,
    };
    let _ = unpack_layer(&mut &data[..], &target, &opts, "fuzz");
    let meta = std::fs::symlink_metadata(&canary).expect("canary still there");
    assert!(meta.file_type().is_file(), "canary replaced");
    assert_eq!(
        std::fs::read(&canary).expect("canary"),
        CANARY,
        "canary written"
    );
    let mut beside: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("scratch dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    beside.sort();
    assert_eq!(beside, ["canary", "target"], "an entry escaped the target");
    let target_meta = std::fs::symlink_metadata(&target).expect("target");
    assert!(target_meta.is_dir(), "target replaced");
});

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

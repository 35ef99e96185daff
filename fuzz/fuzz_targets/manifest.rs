//! Static pod manifests: bytes → decode (YAML/JSON, multi-document) → defaults → validation,
//! exactly as the file and URL sources run it (`ironlet::config::read_manifest`).
#![no_main]

use std::path::PathBuf;

use ironlet::config::{read_manifest, ManifestOrigin};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let origin = ManifestOrigin::File(PathBuf::from("/etc/kubernetes/manifests/fuzz.yaml"));
    let _ = read_manifest(data, &origin, "fuzz-node");
});

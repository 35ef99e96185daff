//! Image metadata JSON: OCI index, manifest (+ config), docker-archive `manifest.json` and the
//! store's `index.json`, through the store's own parsers (`image::fuzzing::image_json`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ironlet_runtime::image::fuzzing::image_json(data);
});

//! Image references (`docker.io/library/busybox:1.36@sha256:…`): parse, then the accessors
//! and a retag, as the CLI and the image service use them.
#![no_main]

use ironlet_runtime::image::Reference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = Reference::parse(text) {
        let _ = (r.domain(), r.path(), r.name(), r.tag(), r.digest());
        let shown = r.to_string();
        let again = Reference::parse(&shown);
        assert!(
            again.is_ok(),
            "{text:?} parsed, but its display {shown:?} does not"
        );
        let _ = r.with_tag("fuzz");
    }
});

//! Entry points for the fuzz targets in `fuzz/` (not an API; hidden from the docs): the
//! store's private JSON parsers, called exactly as an import calls them.

use super::import::{names_for, record_of};
use super::index::IndexFile;
use super::oci::{self, ConfigFile, DockerArchiveEntry, Index, Manifest};

/// Feeds `bytes` to every image-metadata parser an import runs on outside input: an OCI
/// index (and the names its descriptors carry), a manifest, a config, a docker-archive
/// `manifest.json` and the store's own `index.json`. If `bytes` holds a NUL byte, the part
/// before it is read as a manifest and the rest as its config, as an import pairs them.
/// Returns how many parsers accepted the input; errors are the expected outcome.
pub fn image_json(bytes: &[u8]) -> usize {
    let mut accepted = 0;
    if let Ok(index) = oci::parse_json::<Index>(bytes, "image index", "fuzz") {
        accepted += 1;
        for desc in &index.manifests {
            let _ = oci::is_index(&desc.media_type) || oci::is_manifest(&desc.media_type);
            accepted += usize::from(names_for(desc, Some("fuzz/base")).is_ok());
        }
    }
    if let Ok(config) = oci::parse_json::<ConfigFile>(bytes, "image config", "fuzz") {
        accepted += 1;
        let _ = config.image_config();
        accepted += oci::chain_ids(&config.rootfs.diff_ids).len();
    }
    if let Ok(entries) = oci::parse_json::<Vec<DockerArchiveEntry>>(bytes, "docker", "fuzz") {
        accepted += entries.len();
    }
    accepted += usize::from(serde_json::from_slice::<IndexFile>(bytes).is_ok());
    let (manifest, config) = match bytes.iter().position(|&b| b == 0) {
        Some(nul) => (&bytes[..nul], &bytes[nul + 1..]),
        None => (bytes, &b"{}"[..]),
    };
    if let Ok(manifest) = oci::parse_json::<Manifest>(manifest, "image manifest", "fuzz") {
        accepted += 1;
        accepted += manifest
            .layers
            .iter()
            .filter(|l| oci::is_supported_layer(&l.media_type))
            .count();
        accepted += usize::from(record_of(&manifest, config, "fuzz").is_ok());
    }
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found while writing the `image_json` fuzz target, confirmed by it: a manifest whose
    /// config and layer sizes add up past `u64::MAX` panicked on the addition (debug) or
    /// recorded a wrapped size (release). It must be refused with an error.
    #[test]
    fn manifest_sizes_that_overflow_are_refused_not_a_panic() {
        let input = include_bytes!("../../../fuzz/regressions/image_json/manifest-sizes-overflow");
        let nul = input
            .iter()
            .position(|&b| b == 0)
            .expect("manifest NUL config");
        let manifest: Manifest =
            oci::parse_json(&input[..nul], "image manifest", "test").expect("a manifest");
        let err = record_of(&manifest, &input[nul + 1..], "test").expect_err("sizes overflow");
        assert!(err.to_string().contains("2^64"), "{err}");
        image_json(input);
    }
}

//! Writing a spec into an OCI bundle directory as `config.json`.
//!
//! The write is atomic and durable (temp file in the bundle, fsync, rename, fsync of the
//! directory): after a crash the bundle holds either no config or a complete one. Durable
//! unless the process's container state is throwaway (`ctr run --rm`, see
//! `fsutil::set_state_throwaway`).

use std::path::Path;

use oci_spec::runtime::Spec;

use super::SpecError;

/// Writes `spec` to `<bundle_dir>/config.json`. The bundle directory must exist.
pub fn write_bundle_config(bundle_dir: &Path, spec: &Spec) -> Result<(), SpecError> {
    let path = bundle_dir.join("config.json");
    let bytes =
        serde_json::to_vec_pretty(spec).map_err(|source| SpecError::Serialize { source })?;
    crate::fsutil::write_state(&path, &bytes).map_err(|source| {
        tracing::warn!(?path, ?source, "writing bundle config failed");
        SpecError::WriteBundle {
            path: path.clone(),
            source,
        }
    })?;
    tracing::debug!(?path, bytes = bytes.len(), "wrote bundle config");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_config_reads_back_equal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Spec::default();
        write_bundle_config(dir.path(), &spec).expect("write");
        let back = Spec::load(dir.path().join("config.json")).expect("load");
        assert_eq!(back, spec);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name() != "config.json")
            .collect();
        assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    }

    #[test]
    fn a_missing_bundle_directory_is_an_error_naming_the_path() {
        let err = write_bundle_config(Path::new("/nonexistent/ironlet-bundle"), &Spec::default())
            .expect_err("missing dir");
        assert!(
            err.to_string()
                .contains("/nonexistent/ironlet-bundle/config.json"),
            "{err}"
        );
    }
}

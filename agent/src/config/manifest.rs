//! One manifest (a file's or an HTTP body's bytes) → the static pods it defines: decode,
//! default, validate. Shared by the file and HTTP sources so both treat content identically.
//!
//! Guarantees: a manifest that does not decode yields an error and no pods (its source then
//! keeps that manifest's last good pods); a manifest that decodes yields every valid pod and
//! one [`ManifestError::Invalid`] per invalid pod, so one bad pod never hides the others.

use k8s_openapi::api::core::v1::Pod;

use super::decode::decode_pods;
use super::defaults::{apply_api_defaults, apply_static_defaults, static_pod_uid};
use super::error::{ManifestError, ManifestOrigin};
use super::validate::validate_pod;

/// The largest manifest (a file of the static pod path, or a `--manifest-url` body) accepted:
/// far above any real pod list (a pod with the API server's 256 KiB of annotations is well
/// below it), and it bounds what a hostile or mistaken file can make the agent allocate.
pub const MAX_MANIFEST_BYTES: usize = 8 << 20;

/// The pods of one manifest that decoded.
#[derive(Debug, Clone, Default)]
pub struct ManifestPods {
    /// Valid, fully defaulted pods, in manifest order.
    pub pods: Vec<Pod>,
    /// One error per pod that failed validation.
    pub invalid: Vec<ManifestError>,
}

/// Decodes, defaults and validates the manifest `bytes` read from `origin` for node
/// `node_name`.
pub fn read_manifest(
    bytes: &[u8],
    origin: &ManifestOrigin,
    node_name: &str,
) -> Result<ManifestPods, ManifestError> {
    let decoded = decode_pods(bytes).map_err(|source| ManifestError::Decode {
        origin: origin.clone(),
        source,
    })?;
    let mut result = ManifestPods::default();
    for mut pod in decoded {
        let written_name = pod.metadata.name.clone().unwrap_or_default();
        let uid = static_pod_uid(&pod, origin, node_name);
        apply_api_defaults(&mut pod);
        apply_static_defaults(&mut pod, uid, origin, node_name);
        match validate_pod(&pod) {
            Ok(()) => result.pods.push(pod),
            Err(source) => result.invalid.push(ManifestError::Invalid {
                origin: origin.clone(),
                pod: written_name,
                source,
            }),
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::validate::ValidationError;

    fn origin() -> ManifestOrigin {
        ManifestOrigin::File(PathBuf::from("/etc/kubernetes/manifests/pods.yaml"))
    }

    #[test]
    fn valid_pods_are_kept_and_each_invalid_one_is_reported_by_name() {
        let text = "kind: Pod\nmetadata: {name: good}\nspec: {containers: [{name: c, image: i}]}\n---\nkind: Pod\nmetadata: {name: bad}\nspec: {containers: []}\n";
        let result = read_manifest(text.as_bytes(), &origin(), "node1").unwrap();
        assert_eq!(result.pods.len(), 1);
        assert_eq!(result.pods[0].metadata.name.as_deref(), Some("good-node1"));
        let [ManifestError::Invalid { pod, source, .. }] = &result.invalid[..] else {
            panic!("{:?}", result.invalid);
        };
        assert_eq!(pod, "bad");
        assert_eq!(source.0, [ValidationError::NoContainers]);
    }

    #[test]
    fn an_unnamed_pod_is_reported_as_missing_its_name() {
        let result = read_manifest(
            b"kind: Pod\nspec: {containers: [{name: c, image: i}]}\n",
            &origin(),
            "n",
        )
        .unwrap();
        let [ManifestError::Invalid { source, .. }] = &result.invalid[..] else {
            panic!("{:?}", result.invalid);
        };
        assert_eq!(source.0, [ValidationError::MissingName]);
    }

    #[test]
    fn an_undecodable_manifest_fails_whole_and_names_its_origin() {
        let err = read_manifest(b"kind: Pod\nmetadata: [\n", &origin(), "n").unwrap_err();
        assert!(err.is_whole_manifest());
        assert!(
            err.to_string()
                .starts_with("decoding manifest /etc/kubernetes/manifests/pods.yaml: document 1"),
            "{err}"
        );
    }
}

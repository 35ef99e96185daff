//! Manifest bytes → pods: the one parser every static source uses.
//!
//! Accepted, in one file or HTTP body:
//!
//! * a JSON document, or several concatenated or separated by `---` lines (content starting
//!   with `{`; kubelet itself reads only one pod or list per file);
//! * otherwise a YAML stream: one or more documents separated by `---`;
//! * each document a `Pod`, or a `PodList`/`List` whose `items` are pods (items may omit
//!   `kind`, as `kubectl get -o yaml` output does).
//!
//! Documents (and list items) of kind `ConfigMap` or `Secret` are skipped: they may sit beside
//! the pods that use them, and `crate::objects::FileObjectSource` reads them
//! (through [`decode_documents`]).
//!
//! Empty documents (a trailing `---`, a file of comments) yield nothing and are not errors
//! here; the file source separately refuses a file that is all whitespace (see `file_scan`).
//! Anything else fails the whole manifest with a [`DecodeError`] naming the document: a
//! half-understood file is never partly applied.
//!
//! Current behaviour: unknown fields are ignored (as kubelet's non-strict decoder does), and
//! an `apiVersion` other than `v1` on a pod is rejected.

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use super::error::DecodeError;

/// Decodes every pod in `bytes`, in document order.
pub fn decode_pods(bytes: &[u8]) -> Result<Vec<Pod>, DecodeError> {
    let mut pods = Vec::new();
    for (index, document) in decode_documents(bytes)?.into_iter().enumerate() {
        pods.extend(pods_of_document(index + 1, document)?);
    }
    Ok(pods)
}

/// Kinds that may share a manifest with pods and are not pods; the pod decoder skips them.
const SKIPPED_KINDS: [&str; 2] = ["ConfigMap", "Secret"];

/// Splits manifest `bytes` into untyped documents, in order (empty documents are `null`).
pub(crate) fn decode_documents(bytes: &[u8]) -> Result<Vec<Value>, DecodeError> {
    let text = std::str::from_utf8(bytes).map_err(|err| DecodeError::Syntax {
        document: 1,
        reason: format!("not UTF-8: {err}"),
    })?;
    documents(text)
}

/// Splits `text` into JSON values, one per document.
fn documents(text: &str) -> Result<Vec<Value>, DecodeError> {
    if !text.trim_start().starts_with('{') {
        return yaml_documents(text, 0);
    }
    // JSON content may still be a stream of documents separated by `---` lines (as
    // `kubectl get -o json` output joined by hand is): each part is JSON or YAML on its own.
    let mut values = Vec::new();
    for part in split_at_separator_lines(text) {
        let numbered = values.len();
        if part.trim_start().starts_with('{') {
            values.extend(json_documents(part, numbered)?);
        } else {
            values.extend(
                yaml_documents(part, numbered)?
                    .into_iter()
                    .filter(|v| !v.is_null()),
            );
        }
    }
    Ok(values)
}

/// The parts of `text` between lines that are exactly `---` (a YAML document separator).
fn split_at_separator_lines(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            parts.push(&text[start..line_start]);
            start = line_start + line.len();
        }
        line_start += line.len();
    }
    parts.push(&text[start..]);
    parts
}

/// The concatenated JSON values of `text`, numbered after `numbered` earlier documents.
fn json_documents(text: &str, numbered: usize) -> Result<Vec<Value>, DecodeError> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .enumerate()
        .map(|(index, value)| {
            value.map_err(|err| DecodeError::Syntax {
                document: numbered + index + 1,
                reason: err.to_string(),
            })
        })
        .collect()
}

/// The YAML documents of `text`, numbered after `numbered` earlier documents.
fn yaml_documents(text: &str, numbered: usize) -> Result<Vec<Value>, DecodeError> {
    serde_yaml::Deserializer::from_str(text)
        .enumerate()
        .map(|(index, document)| {
            let mut value = Value::deserialize(document).map_err(|err| DecodeError::Syntax {
                document: numbered + index + 1,
                reason: err.to_string(),
            })?;
            octal_modes(&mut value);
            Ok(value)
        })
        .collect()
}

/// Reads YAML 1.1 octal integers (`0644`) in `mode` and `defaultMode` fields as octal, as
/// Kubernetes' YAML decoder does; serde_yaml follows YAML 1.2 and yields the string `"0644"`,
/// which would make the ubiquitous `defaultMode: 0644` a type error. String maps (ConfigMap
/// and Secret data, labels, annotations) are left alone.
fn octal_modes(value: &mut Value) {
    const STRING_MAPS: [&str; 5] = ["data", "stringData", "binaryData", "labels", "annotations"];
    match value {
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if STRING_MAPS.contains(&key.as_str()) {
                    continue;
                }
                if key == "mode" || key == "defaultMode" {
                    if let Some(octal) = field.as_str().and_then(yaml11_octal) {
                        *field = Value::from(octal);
                        continue;
                    }
                }
                octal_modes(field);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

/// `0[0-7]+` → its octal value.
fn yaml11_octal(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('0').filter(|d| !d.is_empty())?;
    i64::from_str_radix(digits, 8).ok()
}

fn pods_of_document(document: usize, value: Value) -> Result<Vec<Pod>, DecodeError> {
    if value.is_null() {
        return Ok(Vec::new());
    }
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .ok_or(DecodeError::MissingKind { document })?;
    match kind {
        "Pod" => Ok(vec![to_pod(document, None, value)?]),
        "PodList" | "List" => {
            let Some(Value::Array(items)) = value.get("items").cloned() else {
                return Ok(Vec::new());
            };
            items
                .into_iter()
                .enumerate()
                .filter(|(_, value)| {
                    !value
                        .get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|kind| SKIPPED_KINDS.contains(&kind))
                })
                .map(
                    |(item, value)| match value.get("kind").and_then(Value::as_str) {
                        None | Some("Pod") => to_pod(document, Some(item), value),
                        Some(other) => Err(DecodeError::UnsupportedKind {
                            document,
                            kind: format!("{other} (items[{item}])"),
                        }),
                    },
                )
                .collect()
        }
        kind if SKIPPED_KINDS.contains(&kind) => Ok(Vec::new()),
        other => Err(DecodeError::UnsupportedKind {
            document,
            kind: other.to_owned(),
        }),
    }
}

fn to_pod(document: usize, item: Option<usize>, value: Value) -> Result<Pod, DecodeError> {
    serde_json::from_value(value).map_err(|err| DecodeError::Pod {
        document,
        item,
        reason: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    const POD_A: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: busybox}]\n";

    #[test]
    fn a_single_yaml_pod_decodes() {
        let pods = decode_pods(POD_A.as_bytes()).unwrap();
        assert_eq!(names(&pods), ["a"]);
    }

    #[test]
    fn a_multi_document_yaml_stream_yields_every_pod_and_skips_empty_documents() {
        let text = format!(
            "---\n{POD_A}---\n# only a comment\n---\n{}---\n",
            POD_A.replace("name: a", "name: b")
        );
        let pods = decode_pods(text.as_bytes()).unwrap();
        assert_eq!(names(&pods), ["a", "b"]);
    }

    #[test]
    fn a_json_pod_and_concatenated_json_pods_decode() {
        let one = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        assert_eq!(names(&decode_pods(one.as_bytes()).unwrap()), ["j"]);
        let two = format!("{one}\n{}", one.replace("\"j\"", "\"k\""));
        assert_eq!(names(&decode_pods(two.as_bytes()).unwrap()), ["j", "k"]);
    }

    #[test]
    fn json_documents_separated_by_yaml_separators_decode() {
        let one = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        let k = one.replace("\"j\"", "\"k\"");
        let text = format!("{one}\n---\n{k}\n---\n{POD_A}---\n");
        assert_eq!(
            names(&decode_pods(text.as_bytes()).unwrap()),
            ["j", "k", "a"]
        );
        let broken = format!("{one}\n---\n{{\"kind\": \n");
        assert!(matches!(
            decode_pods(broken.as_bytes()),
            Err(DecodeError::Syntax { document: 2, .. })
        ));
    }

    #[test]
    fn pod_lists_and_generic_lists_yield_their_items() {
        let text = "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: x}\n  spec: {containers: [{name: c, image: i}]}\n- kind: Pod\n  metadata: {name: y}\n  spec: {containers: [{name: c, image: i}]}\n";
        assert_eq!(names(&decode_pods(text.as_bytes()).unwrap()), ["x", "y"]);
        let list = text.replace("PodList", "List");
        assert_eq!(names(&decode_pods(list.as_bytes()).unwrap()), ["x", "y"]);
    }

    #[test]
    fn an_empty_manifest_yields_no_pods() {
        assert!(decode_pods(b"").unwrap().is_empty());
        assert!(decode_pods(b"# nothing here\n").unwrap().is_empty());
    }

    #[test]
    fn numeric_quantities_are_accepted() {
        let text = "kind: Pod\nmetadata: {name: q}\nspec:\n  containers:\n  - name: c\n    image: i\n    resources: {requests: {cpu: 1, memory: 0.5}}\n";
        let pods = decode_pods(text.as_bytes()).unwrap();
        let requests = pods[0].spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(requests["cpu"].0, "1");
        assert_eq!(requests["memory"].0, "0.5");
    }

    #[test]
    fn broken_yaml_names_the_document() {
        let text = format!("{POD_A}---\nkind: Pod\nmetadata: [unclosed\n");
        let err = decode_pods(text.as_bytes()).unwrap_err();
        assert!(
            matches!(err, DecodeError::Syntax { document: 2, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_document_without_kind_is_rejected() {
        let err = decode_pods(b"metadata: {name: a}\n").unwrap_err();
        assert_eq!(err, DecodeError::MissingKind { document: 1 });
    }

    #[test]
    fn other_kinds_are_rejected_with_their_kind() {
        let err = decode_pods(b"apiVersion: apps/v1\nkind: Deployment\n").unwrap_err();
        assert_eq!(
            err,
            DecodeError::UnsupportedKind {
                document: 1,
                kind: "Deployment".into()
            }
        );
    }

    #[test]
    fn config_maps_and_secrets_beside_pods_are_skipped_not_rejected() {
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg}}\ndata: {{k: v}}\n---\n{POD_A}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\nstringData: {{k: v}}\n---\nkind: List\nitems:\n- kind: ConfigMap\n  metadata: {{name: listed}}\n- kind: Pod\n  metadata: {{name: b}}\n  spec: {{containers: [{{name: c, image: i}}]}}\n"
        );
        let pods = decode_pods(text.as_bytes()).unwrap();
        assert_eq!(names(&pods), ["a", "b"]);
    }

    #[test]
    fn leading_zero_modes_are_octal_as_in_kubernetes_yaml() {
        let text = "kind: Pod\nmetadata: {name: m}\nspec:\n  containers: [{name: c, image: i}]\n  volumes:\n  - name: s\n    secret:\n      secretName: s\n      defaultMode: 0640\n      items: [{key: k, path: p, mode: 0400}]\n  - name: c\n    configMap: {name: c, defaultMode: 420}\n";
        let pods = decode_pods(text.as_bytes()).unwrap();
        let volumes = pods[0].spec.as_ref().unwrap().volumes.as_ref().unwrap();
        let secret = volumes[0].secret.as_ref().unwrap();
        assert_eq!(secret.default_mode, Some(0o640));
        assert_eq!(secret.items.as_ref().unwrap()[0].mode, Some(0o400));
        assert_eq!(
            volumes[1].config_map.as_ref().unwrap().default_mode,
            Some(420)
        );
        assert_eq!(yaml11_octal("0"), None);
        let cm = decode_documents(b"kind: ConfigMap\ndata: {mode: '0644'}\n").unwrap();
        assert_eq!(
            cm[0]["data"]["mode"], "0644",
            "string maps are not converted"
        );
        assert_eq!(yaml11_octal("089"), None);
    }

    #[test]
    fn a_pod_with_a_wrongly_typed_field_is_rejected_with_the_deserializer_reason() {
        let err =
            decode_pods(b"kind: Pod\nmetadata: {name: a}\nspec: {containers: 3}\n").unwrap_err();
        let DecodeError::Pod {
            document: 1,
            item: None,
            reason,
        } = err
        else {
            panic!("unexpected {err:?}");
        };
        assert!(reason.contains("invalid type"), "{reason}");
    }

    #[test]
    fn a_pod_with_a_foreign_api_version_is_rejected() {
        let err = decode_pods(b"apiVersion: v2\nkind: Pod\nmetadata: {name: a}\n").unwrap_err();
        assert!(matches!(err, DecodeError::Pod { .. }), "{err:?}");
    }
}

//! [`container_hash`]: the fingerprint of a container spec that decides whether a running
//! container still matches its pod — kubelet's `HashContainer`.
//!
//! The hash covers every field of the `v1.Container` except `resources` and `resizePolicy`
//! (those may change in place since in-place pod resize, so a change there must not restart
//! the container). It is the SHA-256 of the container as *canonical JSON* (object keys
//! sorted at every level, no whitespace, absent fields omitted), truncated to its first 16
//! hex characters.
//!
//! Guarantees: the hash depends only on the container's content, not on field order, memory
//! layout, the process or the machine, so it is stable across agent restarts and may be
//! stored on the container (annotation [`HASH`](super::labels::HASH)) and compared later.
//!
//! Current behaviour, not contract: kubelet ≥ 1.31 hashes only `name` and `image` (the only
//! fields of a running pod's container the API lets change). Hashing the whole container is
//! stricter; it is equivalent for API pods and restarts nothing spuriously as long as the pod
//! sources default a manifest the same way every time.

use k8s_openapi::api::core::v1::Container;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Fields left out of the hash: they can change without restarting the container.
const UNHASHED_FIELDS: [&str; 2] = ["resources", "resizePolicy"];

/// Hex characters of the SHA-256 kept in the hash (64 bits).
const HASH_HEX_LEN: usize = 16;

/// The restart-relevant hash of `container`: 16 lowercase hex characters.
#[must_use]
pub fn container_hash(container: &Container) -> String {
    let mut canonical = String::new();
    match serde_json::to_value(container) {
        Ok(Value::Object(mut fields)) => {
            for field in UNHASHED_FIELDS {
                fields.remove(field);
            }
            write_canonical(&Value::Object(fields), &mut canonical);
        }
        // A `Container` always serialises to an object (it has no maps with non-string keys);
        // should that ever change, hash its debug form, which is deterministic too.
        other => {
            tracing::warn!(container = %container.name, ?other, "container did not serialise to a JSON object; hashing its debug form");
            canonical = format!("{container:?}");
        }
    }
    let digest = Sha256::digest(canonical.as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(HASH_HEX_LEN);
    hex
}

/// Appends `value` to `out` as JSON with the keys of every object sorted.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(&Value::String(key.clone()), out);
                out.push(':');
                write_canonical(&fields[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        // Scalars have exactly one compact JSON form.
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        ContainerResizePolicy, EnvVar, Lifecycle, LifecycleHandler, Probe, ResourceRequirements,
        TCPSocketAction,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    fn web() -> Container {
        Container {
            name: "web".into(),
            image: Some("busybox:1.36".into()),
            command: Some(vec!["httpd".into(), "-f".into()]),
            env: Some(vec![EnvVar {
                name: "A".into(),
                value: Some("1".into()),
                ..EnvVar::default()
            }]),
            ..Container::default()
        }
    }

    #[test]
    fn hash_is_sixteen_lowercase_hex_characters() {
        let hash = container_hash(&web());
        assert_eq!(hash.len(), 16);
        assert!(hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn equal_containers_hash_equal_and_the_hash_is_pinned() {
        assert_eq!(container_hash(&web()), container_hash(&web().clone()));
        // Pinned: a change here restarts every container on agent upgrade. Update only on
        // purpose.
        assert_eq!(container_hash(&Container::default()), {
            let digest = hex::encode(Sha256::digest(br#"{"name":""}"#));
            digest[..16].to_owned()
        });
    }

    #[test]
    fn image_command_env_and_probe_changes_change_the_hash() {
        let base = container_hash(&web());
        let mut image = web();
        image.image = Some("busybox:1.37".into());
        let mut args = web();
        args.args = Some(vec!["-p".into(), "8080".into()]);
        let mut env = web();
        env.env = None;
        let mut probe = web();
        probe.liveness_probe = Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                ..TCPSocketAction::default()
            }),
            ..Probe::default()
        });
        let mut hook = web();
        hook.lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler::default()),
            ..Lifecycle::default()
        });
        for changed in [image, args, env, probe, hook] {
            assert_ne!(container_hash(&changed), base, "{changed:?}");
        }
    }

    #[test]
    fn resources_and_resize_policy_do_not_change_the_hash() {
        let mut resized = web();
        resized.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([("cpu".into(), Quantity("2".into()))])),
            ..ResourceRequirements::default()
        });
        resized.resize_policy = Some(vec![ContainerResizePolicy {
            resource_name: "cpu".into(),
            restart_policy: "NotRequired".into(),
        }]);
        assert_eq!(container_hash(&resized), container_hash(&web()));
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let value = serde_json::json!({"b": [ {"z": 1, "a": null} ], "a": "x\"y"});
        let mut out = String::new();
        write_canonical(&value, &mut out);
        assert_eq!(out, r#"{"a":"x\"y","b":[{"a":null,"z":1}]}"#);
    }
}

//! The files of configMap, secret, downwardAPI and projected volumes, computed as kubelet's
//! `configmap.MakePayload`, `secret.MakePayload`, `downwardapi.CollectData` and the projected
//! plugin's `collectData` do.
//!
//! * configMap/secret without `items`: every key (ConfigMap `data` and `binaryData`) becomes
//!   a file with `defaultMode`; with `items`: only the listed keys, at their `path`, with
//!   their `mode` or `defaultMode`. A listed key the object lacks fails the volume unless the
//!   reference is `optional`.
//! * A missing object fails the volume unless `optional`, in which case it contributes no
//!   files (the volume is then empty, and fills in once the object appears).
//! * downwardAPI items: `fieldRef` (metadata only) and `resourceFieldRef` (which must name
//!   its container).
//! * projected: the union of its sources, later sources overwriting earlier paths;
//!   `serviceAccountToken` asks the object source for a token bound to the pod (the API
//!   source issues one through TokenRequest; without an API server it is skipped with a
//!   warning); `clusterTrustBundle` and `podCertificate` are skipped with a warning.

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource};

use super::atomic_writer::{clean_path, FileProjection, Payload};
use super::error::SetUpError;
use crate::env::fieldpath::volume_field_value;
use crate::env::resource::resource_field_value;
use crate::env::Allocatable;
use crate::objects::{ObjectSource, TokenRequestFor};

/// kubelet's default file mode for configMap, secret, downwardAPI and projected volumes.
pub(crate) const DEFAULT_MODE: u32 = 0o644;

/// What payload computation reads.
#[derive(Clone, Copy)]
pub(crate) struct PayloadContext<'a> {
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub objects: &'a dyn ObjectSource,
    pub allocatable: &'a Allocatable,
}

/// A mode from the API (`int32`, e.g. 420 for 0644), or `default`.
pub(crate) fn mode_or(mode: Option<i32>, default: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .map_or(default, |m| m & 0o7777)
}

/// The keys of one ConfigMap or Secret, and how to report a missing listed key.
struct Keys {
    entries: Vec<(String, Vec<u8>)>,
    missing_key: fn(String) -> SetUpError,
}

fn key_payload(
    keys: &Keys,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), SetUpError> {
    let mut add = |path: &str, data: &[u8], mode: u32| -> Result<(), SetUpError> {
        payload.insert(
            clean_path(path)?,
            FileProjection {
                data: data.to_vec(),
                mode,
            },
        );
        Ok(())
    };
    match items {
        None | Some([]) => {
            for (key, data) in &keys.entries {
                add(key, data, default_mode)?;
            }
        }
        Some(items) => {
            for item in items {
                match keys.entries.iter().find(|(key, _)| *key == item.key) {
                    Some((_, data)) => add(&item.path, data, mode_or(item.mode, default_mode))?,
                    None if optional => {}
                    None => return Err((keys.missing_key)(item.key.clone())),
                }
            }
        }
    }
    Ok(())
}

/// Adds the files of ConfigMap `name` to `payload`.
pub(crate) async fn add_config_map(
    ctx: &PayloadContext<'_>,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), SetUpError> {
    let found = ctx
        .objects
        .config_map(ctx.namespace, name)
        .await
        .map_err(|source| SetUpError::Lookup {
            kind: "configmap",
            name: name.to_owned(),
            source,
        })?;
    let entries = match found {
        Some(cm) => {
            let text = cm
                .data
                .into_iter()
                .flatten()
                .map(|(k, v)| (k, v.into_bytes()));
            let binary = cm.binary_data.into_iter().flatten().map(|(k, v)| (k, v.0));
            text.chain(binary).collect()
        }
        None if optional => Vec::new(),
        None => {
            return Err(SetUpError::ConfigMapNotFound {
                name: name.to_owned(),
            })
        }
    };
    let keys = Keys {
        entries,
        missing_key: |key| SetUpError::ConfigMapKey { key },
    };
    key_payload(&keys, items, default_mode, optional, payload)
}

/// Adds the files of Secret `name` to `payload`.
pub(crate) async fn add_secret(
    ctx: &PayloadContext<'_>,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    payload: &mut Payload,
) -> Result<(), SetUpError> {
    let found = ctx
        .objects
        .secret(ctx.namespace, name)
        .await
        .map_err(|source| SetUpError::Lookup {
            kind: "secret",
            name: name.to_owned(),
            source,
        })?;
    let entries = match found {
        Some(secret) => secret
            .data
            .into_iter()
            .flatten()
            .map(|(k, v)| (k, v.0))
            .collect(),
        None if optional => Vec::new(),
        None => {
            return Err(SetUpError::SecretNotFound {
                name: name.to_owned(),
            })
        }
    };
    let keys = Keys {
        entries,
        missing_key: |key| SetUpError::SecretKey { key },
    };
    key_payload(&keys, items, default_mode, optional, payload)
}

/// Adds downwardAPI `items` to `payload`.
pub(crate) fn add_downward_api(
    ctx: &PayloadContext<'_>,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    payload: &mut Payload,
) -> Result<(), SetUpError> {
    for item in items {
        let data = if let Some(field) = &item.field_ref {
            volume_field_value(field, ctx.pod)?
        } else if let Some(resource) = &item.resource_field_ref {
            resource_field_value(resource, ctx.pod, None, ctx.allocatable)?
        } else {
            String::new()
        };
        payload.insert(
            clean_path(&item.path)?,
            FileProjection {
                data: data.into_bytes(),
                mode: mode_or(item.mode, default_mode),
            },
        );
    }
    Ok(())
}

/// The files of a projected volume.
pub(crate) async fn projected(
    ctx: &PayloadContext<'_>,
    volume: &str,
    source: &ProjectedVolumeSource,
) -> Result<Payload, SetUpError> {
    let default_mode = mode_or(source.default_mode, DEFAULT_MODE);
    let mut payload = Payload::new();
    for projection in source.sources.iter().flatten() {
        if let Some(cm) = &projection.config_map {
            let optional = cm.optional == Some(true);
            let items = cm.items.as_deref();
            add_config_map(ctx, &cm.name, items, default_mode, optional, &mut payload).await?;
        } else if let Some(secret) = &projection.secret {
            let optional = secret.optional == Some(true);
            let items = secret.items.as_deref();
            add_secret(
                ctx,
                &secret.name,
                items,
                default_mode,
                optional,
                &mut payload,
            )
            .await?;
        } else if let Some(downward) = &projection.downward_api {
            let items = downward.items.as_deref().unwrap_or_default();
            add_downward_api(ctx, items, default_mode, &mut payload)?;
        } else if let Some(token) = projection
            .service_account_token
            .as_ref()
            .filter(|_| ctx.pod.metadata.uid.is_some())
        {
            let request = TokenRequestFor {
                namespace: ctx.namespace,
                service_account: ctx
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.as_deref())
                    .filter(|n| !n.is_empty())
                    .unwrap_or("default"),
                pod_name: ctx.pod.metadata.name.as_deref().unwrap_or_default(),
                pod_uid: ctx.pod.metadata.uid.as_deref().unwrap_or_default(),
                audience: token.audience.as_deref().filter(|a| !a.is_empty()),
                expiration_seconds: token.expiration_seconds.unwrap_or(3600),
                service_account_uid: None,
            };
            let issued = ctx
                .objects
                .service_account_token(&request)
                .await
                .map_err(|source| SetUpError::Lookup {
                    kind: "serviceaccount token",
                    name: request.service_account.to_owned(),
                    source,
                })?;
            match issued {
                Some(issued) => {
                    payload.insert(
                        clean_path(&token.path)?,
                        FileProjection {
                            data: issued.into_bytes(),
                            mode: default_mode,
                        },
                    );
                }
                None => tracing::warn!(
                    pod = ctx.pod.metadata.name.as_deref().unwrap_or_default(),
                    volume,
                    "projected serviceAccountToken skipped: no API server to issue it",
                ),
            }
        } else {
            let kind = if projection.service_account_token.is_some() {
                "serviceAccountToken"
            } else if projection.cluster_trust_bundle.is_some() {
                "clusterTrustBundle"
            } else if projection.pod_certificate.is_some() {
                "podCertificate"
            } else {
                "empty"
            };
            tracing::warn!(
                pod = ctx.pod.metadata.name.as_deref().unwrap_or_default(),
                volume,
                source = kind,
                "projected volume source skipped: it needs an API server to issue it",
            );
        }
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ConfigMap, ObjectFieldSelector, Secret};
    use k8s_openapi::ByteString;

    use super::*;
    use crate::objects::ObjectError;

    struct One(ConfigMap);

    #[async_trait]
    impl ObjectSource for One {
        async fn config_map(&self, _: &str, name: &str) -> Result<Option<ConfigMap>, ObjectError> {
            Ok((name == "cfg").then(|| self.0.clone()))
        }
        async fn secret(&self, _: &str, _: &str) -> Result<Option<Secret>, ObjectError> {
            Ok(None)
        }
        async fn service_account_token(
            &self,
            r: &TokenRequestFor<'_>,
        ) -> Result<Option<String>, ObjectError> {
            Ok(Some(format!(
                "{}/{} for {} {} aud {:?} exp {}",
                r.namespace,
                r.service_account,
                r.pod_name,
                r.pod_uid,
                r.audience,
                r.expiration_seconds
            )))
        }
    }

    fn objects() -> One {
        One(ConfigMap {
            data: Some(BTreeMap::from([("a".into(), "text".into())])),
            binary_data: Some(BTreeMap::from([("bin".into(), ByteString(vec![0, 1]))])),
            ..ConfigMap::default()
        })
    }

    fn ctx<'a>(pod: &'a Pod, objects: &'a One, allocatable: &'a Allocatable) -> PayloadContext<'a> {
        PayloadContext {
            pod,
            namespace: "default",
            objects,
            allocatable,
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
            user: None,
        }
    }

    #[tokio::test]
    async fn without_items_every_key_is_a_file_with_the_default_mode() {
        let (pod, objects, alloc) = (Pod::default(), objects(), Allocatable::default());
        let mut payload = Payload::new();
        add_config_map(
            &ctx(&pod, &objects, &alloc),
            "cfg",
            None,
            0o640,
            false,
            &mut payload,
        )
        .await
        .unwrap();
        let files: Vec<_> = payload
            .iter()
            .map(|(p, f)| (p.as_str(), f.data.as_slice(), f.mode))
            .collect();
        assert_eq!(
            files,
            [("a", &b"text"[..], 0o640), ("bin", &[0, 1][..], 0o640)]
        );
    }

    #[tokio::test]
    async fn items_pick_keys_paths_and_modes_and_missing_keys_fail_unless_optional() {
        let (pod, objects, alloc) = (Pod::default(), objects(), Allocatable::default());
        let c = ctx(&pod, &objects, &alloc);
        let items = [
            item("a", "dir/renamed", Some(0o400)),
            item("nope", "x", None),
        ];
        let mut payload = Payload::new();
        let err = add_config_map(&c, "cfg", Some(&items), 0o644, false, &mut payload)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "configmap references non-existent config key: nope"
        );
        let mut payload = Payload::new();
        add_config_map(&c, "cfg", Some(&items), 0o644, true, &mut payload)
            .await
            .unwrap();
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["dir/renamed"]);
        assert_eq!(payload["dir/renamed"].mode, 0o400);
    }

    #[tokio::test]
    async fn a_missing_object_fails_unless_optional_and_a_bad_item_path_is_refused() {
        let (pod, objects, alloc) = (Pod::default(), objects(), Allocatable::default());
        let c = ctx(&pod, &objects, &alloc);
        let mut payload = Payload::new();
        let err = add_secret(&c, "s", None, 0o644, false, &mut payload)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "secret \"s\" not found");
        add_secret(&c, "s", None, 0o644, true, &mut payload)
            .await
            .unwrap();
        assert!(payload.is_empty());
        let escape = [item("a", "../../etc/passwd", None)];
        let err = add_config_map(&c, "cfg", Some(&escape), 0o644, false, &mut payload)
            .await
            .unwrap_err();
        assert!(matches!(err, SetUpError::InvalidPath { .. }), "{err}");
    }

    #[test]
    fn downward_api_items_render_pod_metadata() {
        let mut pod = Pod::default();
        pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        let (objects, alloc) = (objects(), Allocatable::default());
        let items = [DownwardAPIVolumeFile {
            path: "labels".into(),
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: "metadata.labels".into(),
            }),
            ..DownwardAPIVolumeFile::default()
        }];
        let mut payload = Payload::new();
        add_downward_api(&ctx(&pod, &objects, &alloc), &items, 0o644, &mut payload).unwrap();
        assert_eq!(payload["labels"].data, b"app=\"web\"");
    }

    #[test]
    fn api_modes_are_decimal_integers() {
        assert_eq!(mode_or(Some(420), 0), 0o644);
        assert_eq!(mode_or(Some(256), 0), 0o400);
        assert_eq!(mode_or(None, 0o600), 0o600);
        assert_eq!(mode_or(Some(-1), 0o600), 0o600);
    }

    #[tokio::test]
    async fn a_projected_service_account_token_is_requested_for_the_pods_account_and_bound_to_it() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "uid": "u1"},
            "spec": {"serviceAccountName": "builder", "containers": []}
        }))
        .unwrap();
        let (objects, alloc) = (objects(), Allocatable::default());
        let source: ProjectedVolumeSource = serde_json::from_value(serde_json::json!({
            "defaultMode": 0o440,
            "sources": [
                {"serviceAccountToken": {"path": "token", "audience": "vault"}},
                {"serviceAccountToken": {"path": "api/token", "expirationSeconds": 7200}}
            ]
        }))
        .unwrap();
        let payload = projected(&ctx(&pod, &objects, &alloc), "v", &source)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&payload["token"].data),
            "default/builder for web u1 aud Some(\"vault\") exp 3600"
        );
        assert_eq!(payload["token"].mode, 0o440);
        assert_eq!(
            String::from_utf8_lossy(&payload["api/token"].data),
            "default/builder for web u1 aud None exp 7200"
        );
    }
}

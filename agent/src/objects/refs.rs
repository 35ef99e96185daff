//! The ConfigMaps and Secrets a pod spec names: volumes (`configMap`, `secret`, `projected`
//! sources) and its containers' `env[].valueFrom` and `envFrom` references, each with its
//! `optional` flag. Used to tell up front that a referenced object is missing (`ironlet
//! play`) instead of leaving the pod waiting with `CreateContainerConfigError`.

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// The kind of a referenced object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// `v1/ConfigMap`.
    ConfigMap,
    /// `v1/Secret`.
    Secret,
}

impl ObjectKind {
    /// kubelet's lower-case spelling in its messages (`configmap "x" not found`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }
}

/// One reference of a pod to an object in its namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// ConfigMap or Secret.
    pub kind: ObjectKind,
    /// The object's name.
    pub name: String,
    /// `optional: true`: the pod runs without it.
    pub optional: bool,
}

/// Every ConfigMap and Secret `spec` references, sorted, each (kind, name, optional) once.
/// Ephemeral containers are not looked at (static pods have none).
#[must_use]
pub fn pod_object_refs(spec: &PodSpec) -> Vec<ObjectRef> {
    let mut refs = Vec::new();
    let mut add = |kind, name: &str, optional: Option<bool>| {
        refs.push(ObjectRef {
            kind,
            name: name.to_owned(),
            optional: optional.unwrap_or(false),
        });
    };
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            add(ObjectKind::ConfigMap, &cm.name, cm.optional);
        }
        if let Some(secret) = &volume.secret {
            if let Some(name) = &secret.secret_name {
                add(ObjectKind::Secret, name, secret.optional);
            }
        }
        let sources = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten());
        for source in sources {
            if let Some(cm) = &source.config_map {
                add(ObjectKind::ConfigMap, &cm.name, cm.optional);
            }
            if let Some(secret) = &source.secret {
                add(ObjectKind::Secret, &secret.name, secret.optional);
            }
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for container in containers {
        container_refs(container, &mut add);
    }
    refs.sort();
    refs.dedup();
    refs
}

fn container_refs(container: &Container, add: &mut impl FnMut(ObjectKind, &str, Option<bool>)) {
    for env in container.env.iter().flatten() {
        let Some(from) = &env.value_from else {
            continue;
        };
        if let Some(key) = &from.config_map_key_ref {
            add(ObjectKind::ConfigMap, &key.name, key.optional);
        }
        if let Some(key) = &from.secret_key_ref {
            add(ObjectKind::Secret, &key.name, key.optional);
        }
    }
    for from in container.env_from.iter().flatten() {
        if let Some(cm) = &from.config_map_ref {
            add(ObjectKind::ConfigMap, &cm.name, cm.optional);
        }
        if let Some(secret) = &from.secret_ref {
            add(ObjectKind::Secret, &secret.name, secret.optional);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_projections_env_and_env_from_are_found_with_their_optional_flag() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "volumes": [
                {"name": "a", "configMap": {"name": "cm-vol"}},
                {"name": "b", "secret": {"secretName": "sec-vol", "optional": true}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "cm-proj"}},
                    {"secret": {"name": "sec-proj"}},
                    {"downwardAPI": {"items": []}}
                ]}},
                {"name": "d", "emptyDir": {}}
            ],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "sec-from"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-vol", "key": "k"}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sec-key", "key": "k", "optional": true}}},
                {"name": "Z", "value": "plain"}
            ], "envFrom": [{"configMapRef": {"name": "cm-from"}}]}]
        }))
        .expect("spec decodes");
        let got: Vec<_> = pod_object_refs(&spec)
            .into_iter()
            .map(|r| (r.kind.as_str(), r.name, r.optional))
            .collect();
        let want = [
            ("configmap", "cm-from", false),
            ("configmap", "cm-proj", false),
            ("configmap", "cm-vol", false),
            ("secret", "sec-from", false),
            ("secret", "sec-key", true),
            ("secret", "sec-proj", false),
            ("secret", "sec-vol", true),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(k, n, o)| (*k, (*n).to_owned(), *o))
            .collect();
        assert_eq!(got, want);
    }
}

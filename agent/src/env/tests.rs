//! Unit tests of [`container_env`] against an in-memory object source.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, ObjectFieldSelector, PodSpec,
    ResourceFieldSelector, SecretEnvSource, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;

use super::*;

#[derive(Default)]
struct Fake {
    config_maps: BTreeMap<(String, String), ConfigMap>,
    secrets: BTreeMap<(String, String), Secret>,
    broken: bool,
}

#[async_trait]
impl ObjectSource for Fake {
    async fn config_map(&self, ns: &str, name: &str) -> Result<Option<ConfigMap>, ObjectError> {
        if self.broken {
            return Err(ObjectError::Task {
                reason: "boom".into(),
            });
        }
        Ok(self.config_maps.get(&(ns.into(), name.into())).cloned())
    }

    async fn secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, ObjectError> {
        Ok(self.secrets.get(&(ns.into(), name.into())).cloned())
    }
}

fn fake() -> Fake {
    let mut fake = Fake::default();
    let data: BTreeMap<String, String> = [
        ("HOST", "db.local"),
        ("PORT", "5432"),
        ("bad=key", "x"),
        ("MODE", "from-cm"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    fake.config_maps.insert(
        ("ns".into(), "cfg".into()),
        ConfigMap {
            metadata: ObjectMeta::default(),
            data: Some(data),
            ..ConfigMap::default()
        },
    );
    fake.secrets.insert(
        ("ns".into(), "creds".into()),
        Secret {
            data: Some([("PASSWORD".to_owned(), ByteString(b"hunter2".to_vec()))].into()),
            ..Secret::default()
        },
    );
    fake
}

fn pod(containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers,
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn var_from(name: &str, from: EnvVarSource) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(from),
    }
}

fn cm_key(name: &str, key: &str, optional: bool) -> EnvVarSource {
    EnvVarSource {
        config_map_key_ref: Some(ConfigMapKeySelector {
            name: name.into(),
            key: key.into(),
            optional: Some(optional),
        }),
        ..EnvVarSource::default()
    }
}

async fn env_of(container: Container, objects: &Fake) -> Result<Vec<(String, String)>, EnvError> {
    let p = pod(vec![container.clone()]);
    let ctx = EnvContext {
        objects,
        services: None,
        node_name: "node-a",
        pod_ip: Some("10.1.0.7"),
        host_ip: Some("192.168.0.2"),
        allocatable: Allocatable {
            cpu_milli: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 0,
        },
    };
    container_env(&p, &container, &ctx).await
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn env_from_comes_first_with_prefix_and_env_overrides_it_in_place() {
    let container = Container {
        name: "app".into(),
        env_from: Some(vec![
            EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "cfg".into(),
                    optional: None,
                }),
                prefix: Some("DB_".into()),
                secret_ref: None,
            },
            EnvFromSource {
                config_map_ref: None,
                prefix: None,
                secret_ref: Some(SecretEnvSource {
                    name: "creds".into(),
                    optional: None,
                }),
            },
        ]),
        env: Some(vec![
            var("DB_MODE", "override"),
            var("URL", "postgres://$(DB_HOST):$(DB_PORT)/$(NOPE)"),
        ]),
        ..Container::default()
    };
    let env = env_of(container, &fake()).await.unwrap();
    assert_eq!(
        env,
        pairs(&[
            ("DB_HOST", "db.local"),
            ("DB_MODE", "override"),
            ("DB_PORT", "5432"),
            ("PASSWORD", "hunter2"),
            ("URL", "postgres://db.local:5432/$(NOPE)"),
        ])
    );
}

#[tokio::test]
async fn values_expand_only_variables_defined_before_them() {
    let container = Container {
        name: "app".into(),
        env: Some(vec![
            var("A", "$(B)-a"),
            var("B", "b"),
            var("C", "$(A)|$(B)|$$(B)"),
            var("EMPTY", ""),
        ]),
        ..Container::default()
    };
    let env = env_of(container, &Fake::default()).await.unwrap();
    assert_eq!(
        env,
        pairs(&[
            ("A", "$(B)-a"),
            ("B", "b"),
            ("C", "$(B)-a|b|$(B)"),
            ("EMPTY", "")
        ])
    );
}

#[tokio::test]
async fn downward_api_fields_and_resources_resolve() {
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            api_version: Some("v1".into()),
            field_path: path.into(),
        }),
        ..EnvVarSource::default()
    };
    let container = Container {
        name: "app".into(),
        env: Some(vec![
            var_from("NAME", field("metadata.name")),
            var_from("NS", field("metadata.namespace")),
            var_from("UID", field("metadata.uid")),
            var_from("NODE", field("spec.nodeName")),
            var_from("IP", field("status.podIP")),
            var_from("HOST", field("status.hostIP")),
            var_from(
                "CPU",
                EnvVarSource {
                    resource_field_ref: Some(ResourceFieldSelector {
                        container_name: None,
                        divisor: None,
                        resource: "limits.cpu".into(),
                    }),
                    ..EnvVarSource::default()
                },
            ),
        ]),
        ..Container::default()
    };
    let env = env_of(container, &Fake::default()).await.unwrap();
    assert_eq!(
        env,
        pairs(&[
            ("NAME", "web"),
            ("NS", "ns"),
            ("UID", "uid-1"),
            ("NODE", "node-a"),
            ("IP", "10.1.0.7"),
            ("HOST", "192.168.0.2"),
            ("CPU", "2"),
        ])
    );
}

#[tokio::test]
async fn key_refs_read_config_maps_and_secrets_and_honour_optional() {
    let container = Container {
        name: "app".into(),
        env: Some(vec![
            var_from("PORT", cm_key("cfg", "PORT", false)),
            var_from("GONE", cm_key("cfg", "absent", true)),
            var_from("ALSO_GONE", cm_key("missing", "k", true)),
            var_from(
                "PW",
                EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: "creds".into(),
                        key: "PASSWORD".into(),
                        optional: None,
                    }),
                    ..EnvVarSource::default()
                },
            ),
        ]),
        ..Container::default()
    };
    let env = env_of(container, &fake()).await.unwrap();
    assert_eq!(env, pairs(&[("PORT", "5432"), ("PW", "hunter2")]));
}

#[tokio::test]
async fn a_missing_config_map_fails_with_kubelets_message_naming_container_and_variable() {
    let container = Container {
        name: "app".into(),
        env: Some(vec![var_from("X", cm_key("missing", "k", false))]),
        ..Container::default()
    };
    let err = env_of(container, &fake()).await.unwrap_err();
    assert_eq!(err.message(), "configmap \"missing\" not found");
    assert_eq!(
        err.to_string(),
        "container \"app\": env \"X\": configmap \"missing\" not found"
    );
    assert_eq!(EnvError::REASON, "CreateContainerConfigError");
}

#[tokio::test]
async fn a_missing_key_and_a_missing_env_from_source_fail_unless_optional() {
    let key = Container {
        name: "app".into(),
        env: Some(vec![var_from("X", cm_key("cfg", "nope", false))]),
        ..Container::default()
    };
    assert_eq!(
        env_of(key, &fake()).await.unwrap_err().message(),
        "couldn't find key nope in ConfigMap ns/cfg"
    );
    let from = |optional| Container {
        name: "app".into(),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: None,
            prefix: None,
            secret_ref: Some(SecretEnvSource {
                name: "absent".into(),
                optional: Some(optional),
            }),
        }]),
        ..Container::default()
    };
    let err = env_of(from(false), &fake()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "container \"app\": secret \"absent\" not found"
    );
    assert!(env_of(from(true), &fake()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_lookup_fails_even_an_optional_reference() {
    let container = Container {
        name: "app".into(),
        env: Some(vec![var_from("X", cm_key("cfg", "k", true))]),
        ..Container::default()
    };
    let objects = Fake {
        broken: true,
        ..Fake::default()
    };
    let err = env_of(container, &objects).await.unwrap_err();
    assert!(matches!(err.kind, EnvErrorKind::Lookup { .. }), "{err}");
}

#[test]
fn env_var_names_follow_the_relaxed_rule() {
    assert!(is_env_var_name("PATH"));
    assert!(is_env_var_name("my.var-1 x"));
    assert!(!is_env_var_name(""));
    assert!(!is_env_var_name("a=b"));
    assert!(!is_env_var_name("tab\t"));
    assert!(!is_env_var_name("é"));
}

/// A Service cache with fixed contents.
struct FakeServices {
    services: Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>,
    synced: bool,
}

#[async_trait]
impl ServiceLister for FakeServices {
    fn list(&self) -> Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>> {
        self.services.clone()
    }

    async fn wait_synced(&self, _: std::time::Duration) -> bool {
        self.synced
    }
}

async fn env_with_services(
    container: Container,
    services: &FakeServices,
) -> Result<Vec<(String, String)>, EnvError> {
    let p = pod(vec![container.clone()]);
    let objects = Fake::default();
    let ctx = EnvContext {
        objects: &objects,
        services: Some(services),
        node_name: "node-a",
        pod_ip: None,
        host_ip: None,
        allocatable: Allocatable {
            cpu_milli: 2000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 0,
        },
    };
    container_env(&p, &container, &ctx).await
}

fn fooservice() -> FakeServices {
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fooservice", "namespace": "ns"},
        "spec": {"clusterIP": "10.0.0.11", "ports": [{"port": 8765, "protocol": "TCP"}]},
    }))
    .expect("service");
    FakeServices {
        services: vec![std::sync::Arc::new(service)],
        synced: true,
    }
}

#[tokio::test]
async fn service_links_come_after_env_which_overrides_them_and_can_reference_them() {
    let container = Container {
        name: "c".into(),
        env: Some(vec![
            EnvVar {
                name: "FOOSERVICE_SERVICE_PORT".into(),
                value: Some("1".into()),
                value_from: None,
            },
            EnvVar {
                name: "URL".into(),
                value: Some("http://$(FOOSERVICE_SERVICE_HOST)/".into()),
                value_from: None,
            },
        ]),
        ..Container::default()
    };
    let env = env_with_services(container, &fooservice())
        .await
        .expect("env");
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(
        get("FOOSERVICE_SERVICE_PORT"),
        Some("1"),
        "explicit env wins"
    );
    assert_eq!(get("URL"), Some("http://10.0.0.11/"));
    assert_eq!(get("FOOSERVICE_SERVICE_HOST"), Some("10.0.0.11"));
    assert_eq!(get("FOOSERVICE_PORT_8765_TCP_ADDR"), Some("10.0.0.11"));
    assert_eq!(
        env[0].0, "FOOSERVICE_SERVICE_PORT",
        "declared variables first"
    );
    assert_eq!(
        env.iter()
            .filter(|(k, _)| k == "FOOSERVICE_SERVICE_PORT")
            .count(),
        1
    );
}

#[tokio::test]
async fn an_api_pod_fails_while_services_were_never_listed() {
    let mut services = fooservice();
    services.synced = false;
    let container = Container {
        name: "c".into(),
        ..Container::default()
    };
    let err = env_with_services(container, &services)
        .await
        .expect_err("not synced");
    assert_eq!(
        err.message(),
        "services have not yet been read at least once, cannot construct envvars"
    );
}

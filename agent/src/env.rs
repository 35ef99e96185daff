//! A container's environment, as kubelet's `makeEnvironmentVariables` builds it, and `$(VAR)`
//! expansion for env values, command, args and `subPathExpr`.
//!
//! [`container_env`] resolves, in order:
//! 1. `envFrom` (ConfigMaps and Secrets, each key with the optional `prefix`); a later source
//!    overrides an earlier one; keys that cannot be environment variable names (empty,
//!    containing `=` or a character outside printable ASCII) are skipped with a warning;
//! 2. `env`, in declaration order, each overriding what came before: a `value` with `$(VAR)`
//!    references expanded against the variables resolved so far ([`expand`]), or a
//!    `valueFrom` — `fieldRef` ([`fieldpath`]), `resourceFieldRef` ([`resource`]),
//!    `configMapKeyRef`, `secretKeyRef`.
//!
//! Service link variables ([`services`]) come last, for names not defined above; `$(VAR)` in
//! `env` values also resolves to them (kubelet's mapping: env first, then services).
//!
//! A missing ConfigMap/Secret or key fails the container (the pod worker reports
//! `CreateContainerConfigError` with [`EnvError::message`], kubelet's text) unless the
//! reference is `optional`, in which case it contributes nothing. A lookup that fails for
//! another reason always fails the container.
//!
//! Guarantees: every name appears once in the result, at the position of its first
//! definition, with its last value (kubelet returns map order; the values are the same).
//!
//! An API pod waits up to [`SERVICES_SYNC_WAIT`] for the Service cache's first list and fails
//! with kubelet's "services have not yet been read at least once" if it does not come (a
//! static pod takes what is there). Current behaviour: Secret values that are not UTF-8 are converted lossily; `fileKeyRef`
//! is refused. For hostNetwork pods the caller passes the host IP as `pod_ip`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVarSource, Pod, Secret};

use crate::objects::{ObjectError, ObjectSource};

pub mod expand;
pub mod fieldpath;
pub mod resource;
pub mod services;

pub use expand::{expand, expand_command_and_args, expand_strict, expand_with, MissingVariables};
pub use fieldpath::{FieldPathError, PodRuntimeFields};
pub use resource::{Allocatable, ResourceFieldError};
pub use services::{service_env, ServiceLister};

/// How long an API pod's container start waits for the Service cache's first list.
pub const SERVICES_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What [`container_env`] needs besides the pod: where objects come from and the facts about
/// the node and the pod's network that are not in the pod object.
#[derive(Clone, Copy)]
pub struct EnvContext<'a> {
    /// ConfigMaps and Secrets.
    pub objects: &'a dyn ObjectSource,
    /// Services, for the service link variables; `None`: no API server, no variables.
    pub services: Option<&'a dyn ServiceLister>,
    /// This node's name (`spec.nodeName` when the pod has none).
    pub node_name: &'a str,
    /// The pod's IP (`status.podIP`); the host IP for hostNetwork pods.
    pub pod_ip: Option<&'a str>,
    /// The node's IP (`status.hostIP`).
    pub host_ip: Option<&'a str>,
    /// Node allocatable, the value of unset limits in `resourceFieldRef`.
    pub allocatable: Allocatable,
}

impl std::fmt::Debug for EnvContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvContext")
            .field("node_name", &self.node_name)
            .field("pod_ip", &self.pod_ip)
            .field("host_ip", &self.host_ip)
            .field("allocatable", &self.allocatable)
            .finish_non_exhaustive()
    }
}

/// Why a container's environment could not be built.
#[derive(Debug, Clone, thiserror::Error)]
#[error("container {container:?}: {}{kind}", variable.as_ref().map(|v| format!("env {v:?}: ")).unwrap_or_default())]
pub struct EnvError {
    /// The container.
    pub container: String,
    /// The variable being resolved; `None` for an `envFrom` source.
    pub variable: Option<String>,
    /// What failed.
    pub kind: EnvErrorKind,
}

impl EnvError {
    /// The kubelet reason the pod worker reports for this error.
    pub const REASON: &'static str = "CreateContainerConfigError";

    /// kubelet's message for the container's waiting state, e.g. `configmap "x" not found`.
    #[must_use]
    pub fn message(&self) -> String {
        self.kind.to_string()
    }
}

/// What failed while building an environment; messages are kubelet's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnvErrorKind {
    /// A non-optional ConfigMap does not exist.
    #[error("configmap {name:?} not found")]
    ConfigMapNotFound {
        /// Its name (in the pod's namespace).
        name: String,
    },
    /// A non-optional Secret does not exist.
    #[error("secret {name:?} not found")]
    SecretNotFound {
        /// Its name (in the pod's namespace).
        name: String,
    },
    /// A non-optional `configMapKeyRef` key is absent.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound {
        /// The pod's namespace.
        namespace: String,
        /// The ConfigMap.
        name: String,
        /// The key.
        key: String,
    },
    /// A non-optional `secretKeyRef` key is absent.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound {
        /// The pod's namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// The key.
        key: String,
    },
    /// Looking up a ConfigMap or Secret failed (not: it does not exist).
    #[error("getting {kind} {name:?}: {source}")]
    Lookup {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The lookup error.
        #[source]
        source: ObjectError,
    },
    /// A `fieldRef` has no value.
    #[error(transparent)]
    FieldPath(#[from] FieldPathError),
    /// A `resourceFieldRef` has no value.
    #[error(transparent)]
    ResourceField(#[from] ResourceFieldError),
    /// The Service cache has not completed its first list (an API pod's start waits for it).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotSynced,
    /// `valueFrom.fileKeyRef` (alpha EnvFiles) is not implemented.
    #[error("fileKeyRef is not supported")]
    FileKeyRef,
}

/// Variables in first-definition order; setting an existing name replaces its value in place.
#[derive(Debug, Default)]
struct OrderedEnv {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&at) => self.vars[at].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&at| self.vars[at].1.as_str())
    }
}

/// ConfigMaps and Secrets fetched during one [`container_env`] call (kubelet fetches each
/// once per call too).
struct Objects<'a> {
    source: &'a dyn ObjectSource,
    namespace: &'a str,
    config_maps: HashMap<String, Option<ConfigMap>>,
    secrets: HashMap<String, Option<Secret>>,
}

impl Objects<'_> {
    async fn config_map(&mut self, name: &str) -> Result<Option<&ConfigMap>, EnvErrorKind> {
        if !self.config_maps.contains_key(name) {
            let found = self
                .source
                .config_map(self.namespace, name)
                .await
                .map_err(|source| EnvErrorKind::Lookup {
                    kind: "configmap",
                    name: name.to_owned(),
                    source,
                })?;
            self.config_maps.insert(name.to_owned(), found);
        }
        Ok(self.config_maps.get(name).and_then(Option::as_ref))
    }

    async fn secret(&mut self, name: &str) -> Result<Option<&Secret>, EnvErrorKind> {
        if !self.secrets.contains_key(name) {
            let found = self
                .source
                .secret(self.namespace, name)
                .await
                .map_err(|source| EnvErrorKind::Lookup {
                    kind: "secret",
                    name: name.to_owned(),
                    source,
                })?;
            self.secrets.insert(name.to_owned(), found);
        }
        Ok(self.secrets.get(name).and_then(Option::as_ref))
    }
}

/// Whether `name` can be an environment variable name (kubelet's relaxed rule).
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// Builds `container`'s environment (see the module docs).
pub async fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut objects = Objects {
        source: ctx.objects,
        namespace,
        config_maps: HashMap::new(),
        secrets: HashMap::new(),
    };
    let mut env = OrderedEnv::default();
    let fail = |variable: Option<&str>, kind: EnvErrorKind| EnvError {
        container: container.name.clone(),
        variable: variable.map(str::to_owned),
        kind,
    };
    let service_vars: HashMap<String, String> = pod_service_env(pod, namespace, ctx)
        .await
        .map_err(|kind| fail(None, kind))?
        .into_iter()
        .collect();

    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.as_deref().unwrap_or_default();
        let (what, name, entries): (&str, &str, Vec<(String, String)>) =
            if let Some(r) = &source.config_map_ref {
                let found = objects
                    .config_map(&r.name)
                    .await
                    .map_err(|k| fail(None, k))?;
                match found {
                    Some(cm) => ("configmap", &r.name, config_map_entries(cm)),
                    None if r.optional == Some(true) => continue,
                    None => {
                        let kind = EnvErrorKind::ConfigMapNotFound {
                            name: r.name.clone(),
                        };
                        return Err(fail(None, kind));
                    }
                }
            } else if let Some(r) = &source.secret_ref {
                let found = objects.secret(&r.name).await.map_err(|k| fail(None, k))?;
                match found {
                    Some(secret) => ("secret", &r.name, secret_entries(secret)),
                    None if r.optional == Some(true) => continue,
                    None => {
                        let kind = EnvErrorKind::SecretNotFound {
                            name: r.name.clone(),
                        };
                        return Err(fail(None, kind));
                    }
                }
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (key, value) in entries {
            let key = format!("{prefix}{key}");
            if is_env_var_name(&key) {
                env.set(key, value);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            tracing::warn!(
                container = %container.name,
                source = what,
                name,
                ?invalid,
                "envFrom keys skipped: not valid environment variable names",
            );
        }
    }

    for var in container.env.iter().flatten() {
        let value = var.value.as_deref().unwrap_or_default();
        let resolved = if !value.is_empty() {
            Some(expand_with(value, |name| {
                env.get(name)
                    .or_else(|| service_vars.get(name).map(String::as_str))
            }))
        } else if let Some(from) = &var.value_from {
            value_from(from, pod, container, ctx, &mut objects)
                .await
                .map_err(|kind| fail(Some(&var.name), kind))?
        } else {
            Some(String::new())
        };
        // `None`: an optional reference to something absent contributes nothing.
        if let Some(resolved) = resolved {
            env.set(var.name.clone(), resolved);
        }
    }
    // Sorted, so that a container's environment does not change with map order.
    let mut service_vars: Vec<(String, String)> = service_vars.into_iter().collect();
    service_vars.sort();
    for (name, value) in service_vars {
        if env.get(&name).is_none() {
            env.set(name, value);
        }
    }
    Ok(env.vars)
}

/// The pod's service link variables (kubelet's `getServiceEnvVarMap`).
async fn pod_service_env(
    pod: &Pod,
    namespace: &str,
    ctx: &EnvContext<'_>,
) -> Result<Vec<(String, String)>, EnvErrorKind> {
    let Some(services) = ctx.services else {
        return Ok(Vec::new());
    };
    let wait = if crate::config::is_static_pod(pod) {
        std::time::Duration::ZERO
    } else {
        SERVICES_SYNC_WAIT
    };
    if !services.wait_synced(wait).await && !crate::config::is_static_pod(pod) {
        return Err(EnvErrorKind::ServicesNotSynced);
    }
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    Ok(service_env(&services.list(), namespace, links))
}

/// Resolves one `valueFrom`; `Ok(None)` when an optional reference is absent.
async fn value_from(
    from: &EnvVarSource,
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
    objects: &mut Objects<'_>,
) -> Result<Option<String>, EnvErrorKind> {
    if let Some(field) = &from.field_ref {
        let runtime = PodRuntimeFields {
            node_name: ctx.node_name,
            pod_ip: ctx.pod_ip,
            host_ip: ctx.host_ip,
        };
        return Ok(Some(fieldpath::env_field_value(field, pod, &runtime)?));
    }
    if let Some(field) = &from.resource_field_ref {
        let value = resource::resource_field_value(field, pod, Some(container), &ctx.allocatable)?;
        return Ok(Some(value));
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional == Some(true);
        let Some(cm) = objects.config_map(&r.name).await? else {
            return if optional {
                Ok(None)
            } else {
                Err(EnvErrorKind::ConfigMapNotFound {
                    name: r.name.clone(),
                })
            };
        };
        return match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(value) => Ok(Some(value.clone())),
            None if optional => Ok(None),
            None => Err(EnvErrorKind::ConfigMapKeyNotFound {
                namespace: objects.namespace.to_owned(),
                name: r.name.clone(),
                key: r.key.clone(),
            }),
        };
    }
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional == Some(true);
        let namespace = objects.namespace.to_owned();
        let Some(secret) = objects.secret(&r.name).await? else {
            return if optional {
                Ok(None)
            } else {
                Err(EnvErrorKind::SecretNotFound {
                    name: r.name.clone(),
                })
            };
        };
        return match secret.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(value) => Ok(Some(String::from_utf8_lossy(&value.0).into_owned())),
            None if optional => Ok(None),
            None => Err(EnvErrorKind::SecretKeyNotFound {
                namespace,
                name: r.name.clone(),
                key: r.key.clone(),
            }),
        };
    }
    if from.file_key_ref.is_some() {
        return Err(EnvErrorKind::FileKeyRef);
    }
    Ok(Some(String::new()))
}

/// A ConfigMap's `data` entries (kubelet ignores `binaryData` for env).
fn config_map_entries(cm: &ConfigMap) -> Vec<(String, String)> {
    cm.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn secret_entries(secret: &Secret) -> Vec<(String, String)> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect()
}

#[cfg(test)]
mod tests;

//! Service link environment variables: kubelet's `getServiceEnvVarMap` and
//! `envvars.FromServices`.
//!
//! For every Service with a cluster IP (not `None`, not empty) that applies to a pod:
//! `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (first port), `<NAME>_SERVICE_PORT_<PORT>` per
//! named port, and the docker-link variables `<NAME>_PORT` (first port, `tcp://ip:port`),
//! `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT` and `_ADDR`; NAME is the Service's
//! name upper-cased with `-` → `_`. The Services that apply: the `kubernetes` Service of the
//! `default` namespace always (even with `enableServiceLinks: false`), and, when the pod's
//! `enableServiceLinks` is true (the default), every Service of the pod's namespace (which
//! wins over `default/kubernetes` for a pod in `default`).
//!
//! Services come from a [`ServiceLister`] (a watch-backed cache, see
//! [`crate::apiserver::ApiServices`]); without one (no API server) there are none, as for a
//! kubelet without masters. Variables come out sorted by Service name, each Service's in
//! kubelet's order.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;

/// The services kubelet always links, from the `default` namespace.
const MASTER_SERVICES: [&str; 1] = ["kubernetes"];

/// A cache of the cluster's Services (kubelet's service lister).
#[async_trait]
pub trait ServiceLister: Send + Sync {
    /// Every Service known, all namespaces.
    fn list(&self) -> Vec<Arc<Service>>;

    /// Waits at most `timeout` for the first complete list; whether it has completed.
    async fn wait_synced(&self, timeout: Duration) -> bool;
}

/// kubelet's `IsServiceIPSet`.
fn has_cluster_ip(service: &Service) -> bool {
    let ip = service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default();
    !ip.is_empty() && ip != "None"
}

/// The service link variables of a pod in `namespace` (see the module docs).
pub fn service_env(
    services: &[Arc<Service>],
    namespace: &str,
    enable_service_links: bool,
) -> Vec<(String, String)> {
    let mut chosen: std::collections::BTreeMap<&str, &Service> = Default::default();
    for service in services.iter().filter(|s| has_cluster_ip(s)) {
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(service);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, service);
        }
    }
    chosen.into_values().flat_map(from_service).collect()
}

/// kubelet's `makeEnvVariableName`.
fn env_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// `envvars.FromServices` for one Service with a cluster IP.
fn from_service(service: &Service) -> Vec<(String, String)> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.as_deref().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        // The API requires a port for a Service with a cluster IP.
        return Vec::new();
    };
    let prefix = env_name(service.metadata.name.as_deref().unwrap_or_default());
    let mut vars = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.to_owned()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for port in ports {
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            vars.push((
                format!("{prefix}_SERVICE_PORT_{}", env_name(name)),
                port.port.to_string(),
            ));
        }
    }
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    for (i, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{host}:{}", port.port);
        if i == 0 {
            vars.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        vars.extend([
            (port_prefix.clone(), url),
            (format!("{port_prefix}_PROTO"), lower),
            (format!("{port_prefix}_PORT"), port.port.to_string()),
            (format!("{port_prefix}_ADDR"), ip.to_owned()),
        ]);
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn service(
        ns: &str,
        name: &str,
        ip: &str,
        ports: &[(Option<&str>, i32, &str)],
    ) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: n.map(str::to_owned),
                            port: *p,
                            protocol: Some((*proto).to_owned()),
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }

    fn names(vars: &[(String, String)]) -> Vec<&str> {
        vars.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn a_service_gives_kubelets_variables_in_kubelets_order() {
        let svcs = [service(
            "ns",
            "fooservice-a",
            "10.0.0.7",
            &[(Some("http"), 8765, "TCP"), (Some("dns-x"), 53, "UDP")],
        )];
        let vars = service_env(&svcs, "ns", true);
        let expected = [
            ("FOOSERVICE_A_SERVICE_HOST", "10.0.0.7"),
            ("FOOSERVICE_A_SERVICE_PORT", "8765"),
            ("FOOSERVICE_A_SERVICE_PORT_HTTP", "8765"),
            ("FOOSERVICE_A_SERVICE_PORT_DNS_X", "53"),
            ("FOOSERVICE_A_PORT", "tcp://10.0.0.7:8765"),
            ("FOOSERVICE_A_PORT_8765_TCP", "tcp://10.0.0.7:8765"),
            ("FOOSERVICE_A_PORT_8765_TCP_PROTO", "tcp"),
            ("FOOSERVICE_A_PORT_8765_TCP_PORT", "8765"),
            ("FOOSERVICE_A_PORT_8765_TCP_ADDR", "10.0.0.7"),
            ("FOOSERVICE_A_PORT_53_UDP", "udp://10.0.0.7:53"),
            ("FOOSERVICE_A_PORT_53_UDP_PROTO", "udp"),
            ("FOOSERVICE_A_PORT_53_UDP_PORT", "53"),
            ("FOOSERVICE_A_PORT_53_UDP_ADDR", "10.0.0.7"),
        ];
        let got: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn headless_and_other_namespaces_are_skipped_and_kubernetes_is_always_linked() {
        let svcs = [
            service(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, "TCP")],
            ),
            service("ns", "headless", "None", &[(None, 80, "TCP")]),
            service("other", "elsewhere", "10.0.0.9", &[(None, 80, "TCP")]),
            service("ns", "web", "fd00::5", &[(None, 80, "TCP")]),
        ];
        let linked = service_env(&svcs, "ns", true);
        assert!(names(&linked).contains(&"KUBERNETES_SERVICE_HOST"));
        assert!(names(&linked).contains(&"WEB_SERVICE_HOST"));
        assert!(!names(&linked)
            .iter()
            .any(|n| n.starts_with("HEADLESS") || n.starts_with("ELSEWHERE")));
        assert!(linked.contains(&("WEB_PORT".into(), "tcp://[fd00::5]:80".into())));

        let unlinked = service_env(&svcs, "ns", false);
        assert!(names(&unlinked)
            .iter()
            .all(|n| n.starts_with("KUBERNETES_")));
        assert!(unlinked.contains(&("KUBERNETES_SERVICE_PORT_HTTPS".into(), "443".into())));
    }
}

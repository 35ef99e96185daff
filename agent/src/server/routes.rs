//! Request → response for the agent's endpoints, without I/O, so every route is tested
//! directly:
//!
//! | route                     | answer                                              |
//! |---------------------------|-----------------------------------------------------|
//! | `GET /healthz`            | 200 `ok`, or 500 with the reason from the view      |
//! | `GET /healthz/ping`       | 200 `ok` (the server itself answers)                |
//! | `GET /pods`               | a `v1.PodList` of every pod (kubelet's `/pods`)     |
//! | `GET /pods/<ns>/<name>`   | one `v1.Pod`, or 404 with a `v1.Status` body        |
//! | `GET /metrics`            | Prometheus text, format 0.0.4                       |
//! | `GET /version`            | version, pid and identity of the running binary     |
//!
//! HEAD is answered like GET without a body; other methods get 405, unknown paths 404.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, StatusDetails};
use k8s_openapi::List;

use super::http::{Request, Response, JSON};
use super::{Metrics, PodsView};

pub(super) const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The response to a parsed request.
pub fn route(request: &Request, view: &dyn PodsView, metrics: &Metrics) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        let mut resp = Response::text(405, "method not allowed\n");
        resp.allow = Some("GET, HEAD");
        return resp;
    }
    let segments: Vec<&str> = request.path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["healthz"] => match view.health() {
            Ok(()) => Response::text(200, "ok"),
            Err(reason) => Response::text(500, format!("healthz check failed: {reason}\n")),
        },
        ["healthz", "ping"] => Response::text(200, "ok"),
        ["pods"] | ["pods", ""] => pod_list(view.pods()),
        ["pods", namespace, name] if !namespace.is_empty() && !name.is_empty() => {
            match view.pod(namespace, name) {
                Some(pod) => json(200, &pod),
                None => not_found(namespace, name),
            }
        }
        ["metrics"] => Response::new(200, METRICS_CONTENT_TYPE, metrics.render()),
        ["version"] => json(200, &VersionInfo::current()),
        _ => Response::text(404, "404 page not found\n"),
    }
}

/// What `/version` answers: the agent's version and the identity of the binary it runs.
/// Device and inode of `/proc/self/exe` change when the binary is replaced, so they tell
/// whether an upgrade in place (SIGHUP to the supervisor) took effect.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct VersionInfo {
    version: &'static str,
    pid: u32,
    /// The supervisor, the agent's parent.
    supervisor_pid: i32,
    binary: String,
    binary_device: u64,
    binary_inode: u64,
    /// Process start, clock ticks since boot (`/proc/self/stat` field 22).
    start_ticks: u64,
}

impl VersionInfo {
    fn current() -> Self {
        use std::os::unix::fs::MetadataExt;
        let exe = std::fs::metadata("/proc/self/exe").ok();
        Self {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            supervisor_pid: nix::unistd::getppid().as_raw(),
            binary: std::fs::read_link("/proc/self/exe")
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            binary_device: exe.as_ref().map_or(0, MetadataExt::dev),
            binary_inode: exe.as_ref().map_or(0, MetadataExt::ino),
            start_ticks: ironlet_runtime::zygote::process_start_time(std::process::id() as i32)
                .unwrap_or(0),
        }
    }
}

pub(super) fn pod_list(mut pods: Vec<Pod>) -> Response {
    pods.sort_by(|a, b| {
        let key = |p: &Pod| (p.metadata.namespace.clone(), p.metadata.name.clone());
        key(a).cmp(&key(b))
    });
    json(
        200,
        &List {
            items: pods,
            metadata: ListMeta::default(),
        },
    )
}

/// The `v1.Status` the API server answers a missing pod with.
fn not_found(namespace: &str, name: &str) -> Response {
    json(
        404,
        &Status {
            code: Some(404),
            message: Some(format!(
                "pods \"{name}\" not found in namespace \"{namespace}\""
            )),
            reason: Some("NotFound".into()),
            status: Some("Failure".into()),
            details: Some(StatusDetails {
                name: Some(name.into()),
                kind: Some("pods".into()),
                ..StatusDetails::default()
            }),
            metadata: ListMeta::default(),
        },
    )
}

pub(super) fn json<T: serde::Serialize>(status: u16, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => Response::new(status, JSON, body),
        Err(err) => {
            tracing::error!(?err, "serializing a response");
            Response::text(500, format!("serializing the response: {err}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    struct View {
        pods: Vec<Pod>,
        health: Result<(), String>,
    }

    impl PodsView for View {
        fn pods(&self) -> Vec<Pod> {
            self.pods.clone()
        }
        fn health(&self) -> Result<(), String> {
            self.health.clone()
        }
    }

    fn pod(ns: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn view() -> View {
        View {
            pods: vec![pod("kube-system", "b"), pod("default", "a")],
            health: Ok(()),
        }
    }

    fn get(view: &View, path: &str) -> Response {
        let req = Request {
            method: "GET".into(),
            path: path.into(),
            query: None,
            headers: vec![],
            body: vec![],
        };
        route(&req, view, &Metrics::new())
    }

    #[test]
    fn healthz_reports_ok_or_the_reason_of_the_view() {
        let mut v = view();
        assert_eq!(get(&v, "/healthz").body, b"ok");
        v.health = Err("PLEG is not healthy: last relist 4m ago".into());
        let resp = get(&v, "/healthz");
        assert_eq!(resp.status, 500);
        assert_eq!(
            String::from_utf8(resp.body).unwrap(),
            "healthz check failed: PLEG is not healthy: last relist 4m ago\n"
        );
        assert_eq!(get(&v, "/healthz/ping").status, 200);
    }

    #[test]
    fn pods_is_a_v1_pod_list_sorted_by_namespace_and_name() {
        let resp = get(&view(), "/pods");
        assert_eq!(resp.status, 200);
        let list: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(list["kind"], "PodList");
        assert_eq!(list["apiVersion"], "v1");
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn one_pod_is_found_by_namespace_and_name() {
        let resp = get(&view(), "/pods/kube-system/b");
        assert_eq!(resp.status, 200);
        let pod: Pod = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn a_missing_pod_is_a_404_status_naming_it() {
        let resp = get(&view(), "/pods/default/b");
        assert_eq!(resp.status, 404);
        let status: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(
            status["message"],
            "pods \"b\" not found in namespace \"default\""
        );
    }

    #[test]
    fn metrics_are_prometheus_text() {
        let resp = get(&view(), "/metrics");
        assert_eq!(resp.status, 200);
        assert!(resp.content_type.starts_with("text/plain; version=0.0.4"));
        assert!(String::from_utf8(resp.body)
            .unwrap()
            .contains("kubelet_running_pods 0\n"));
    }

    #[test]
    fn version_names_this_process_and_the_inode_of_its_binary() {
        use std::os::unix::fs::MetadataExt;
        let resp = get(&view(), "/version");
        assert_eq!(resp.status, 200);
        let body: serde_json::Value = serde_json::from_slice(&resp.body).expect("json");
        assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(body["pid"], std::process::id());
        let exe = std::fs::metadata("/proc/self/exe").expect("own binary");
        assert_eq!(body["binaryInode"], exe.ino());
    }

    #[test]
    fn unknown_paths_are_404_and_other_methods_405() {
        for path in [
            "/",
            "/pod",
            "/pods/default",
            "/pods/default/a/x",
            "/pods//a",
        ] {
            assert_eq!(get(&view(), path).status, 404, "{path}");
        }
        let req = Request {
            method: "DELETE".into(),
            path: "/pods".into(),
            query: None,
            headers: vec![],
            body: vec![],
        };
        let resp = route(&req, &view(), &Metrics::new());
        assert_eq!(resp.status, 405);
        assert_eq!(resp.allow, Some("GET, HEAD"));
    }
}

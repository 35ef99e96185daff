//! `ironlet pods [-n NS | -A]` and `ironlet pods get NAME [-o yaml|json|wide]`: the running
//! agent's pods, read over its socket (`<root-dir>/ironlet.sock`), printed as kubectl does.
//!
//! The READY/STATUS/RESTARTS columns follow kubectl's pod printer (`printPod` in
//! `pkg/printers/internalversion`), AGE its `HumanDuration`; RESTARTS omits kubectl's
//! "(5m ago)" suffix.

use super::output::out;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use ironlet::server::client::{self, ClientError, ClientResponse};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use k8s_openapi::List;

const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Args)]
pub struct PodsArgs {
    /// Namespace to list (default: default).
    #[arg(short, long)]
    namespace: Option<String>,
    /// List the pods of all namespaces.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Output format.
    #[arg(short, long, value_enum)]
    output: Option<Output>,
    #[command(subcommand)]
    command: Option<PodsCommand>,
}

#[derive(Debug, Subcommand)]
enum PodsCommand {
    /// Print one pod.
    Get {
        name: String,
        /// The pod's namespace (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// The table with the node name.
    Wide,
    Yaml,
    Json,
}

pub fn run(root: &Path, args: PodsArgs) -> anyhow::Result<ExitCode> {
    let socket = ironlet::server::socket_path(root);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    match args.command {
        None => {
            let namespace = (!args.all_namespaces)
                .then(|| args.namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.into()));
            let list: List<Pod> = fetch(&socket, "/pods")?;
            let pods: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| namespace.as_deref().is_none_or(|ns| namespace_of(p) == ns))
                .collect();
            if pods.is_empty() && args.output.is_none_or(|o| o == Output::Wide) {
                match &namespace {
                    Some(ns) => eprintln!("No resources found in {ns} namespace."),
                    None => eprintln!("No resources found"),
                }
                return Ok(ExitCode::SUCCESS);
            }
            let list = List {
                items: pods,
                metadata: list.metadata,
            };
            out!(
                "{}",
                render(&list, &list.items, args.output, namespace.is_none(), now)?
            )?;
        }
        Some(PodsCommand::Get {
            name,
            namespace,
            output,
        }) => {
            let namespace = namespace
                .or(args.namespace)
                .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
            let pod: Pod = fetch(&socket, &format!("/pods/{namespace}/{name}"))?;
            let pods = std::slice::from_ref(&pod);
            out!(
                "{}",
                render(&pod, pods, output.or(args.output), false, now)?
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `whole` as YAML/JSON, or `pods` as a table.
fn render<T: serde::Serialize>(
    whole: &T,
    pods: &[Pod],
    output: Option<Output>,
    with_namespace: bool,
    now: i64,
) -> anyhow::Result<String> {
    Ok(match output {
        Some(Output::Yaml) => serde_yaml::to_string(whole).context("printing YAML")?,
        Some(Output::Json) => serde_json::to_string_pretty(whole).context("printing JSON")? + "\n",
        None | Some(Output::Wide) => table(pods, with_namespace, output.is_some(), now),
    })
}

/// GETs `path` and decodes the JSON answer; a non-200 answer becomes its `Status` message.
fn fetch<T: serde::de::DeserializeOwned>(socket: &Path, path: &str) -> anyhow::Result<T> {
    let resp = client::get(socket, path).map_err(|err| match err {
        ClientError::Connect { path, source }
            if source.kind() != std::io::ErrorKind::PermissionDenied =>
        {
            anyhow::Error::new(source).context(format!(
                "no agent is running (cannot connect to {})",
                path.display()
            ))
        }
        other => other.into(),
    })?;
    if resp.status != 200 {
        bail!("{}", error_message(&resp));
    }
    serde_json::from_slice(&resp.body)
        .with_context(|| format!("decoding the agent's answer to {path}"))
}

fn error_message(resp: &ClientResponse) -> String {
    serde_json::from_slice::<Status>(&resp.body)
        .ok()
        .and_then(|s| s.message)
        .unwrap_or_else(|| {
            format!(
                "the agent answered {}: {}",
                resp.status,
                String::from_utf8_lossy(&resp.body).trim()
            )
        })
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata
        .namespace
        .as_deref()
        .unwrap_or(DEFAULT_NAMESPACE)
}

/// kubectl's pod table: columns separated by three spaces, the last one unpadded.
/// `now` in Unix seconds.
fn table(pods: &[Pod], with_namespace: bool, wide: bool, now: i64) -> String {
    let mut rows = vec![];
    let mut header = vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.push("NODE");
    }
    rows.push(header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    for pod in pods {
        let c = columns(pod);
        let mut row = vec![];
        if with_namespace {
            row.push(namespace_of(pod).to_owned());
        }
        let age = created_at(pod).map_or_else(
            || "<unknown>".into(),
            |created| human_duration(now - created),
        );
        row.extend([
            pod.metadata.name.clone().unwrap_or_default(),
            c.ready,
            c.status,
            c.restarts.to_string(),
            age,
            c.ip.unwrap_or_else(|| "<none>".into()),
        ]);
        if wide {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            row.push(
                node.filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "<none>".into()),
            );
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len() - 1;
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

/// The READY, STATUS, RESTARTS and IP cells of a pod.
#[derive(Debug, PartialEq, Eq)]
struct PodColumns {
    ready: String,
    status: String,
    restarts: i32,
    ip: Option<String>,
}

/// kubectl's `printPod`: the pod's reason or phase, overridden by the first unfinished
/// init container (`Init:1/2`, `Init:CrashLoopBackOff`), then by waiting/terminated
/// containers (last one wins), `Terminating` when deleted.
fn columns(pod: &Pod) -> PodColumns {
    let no_status = PodStatus::default();
    let status = pod.status.as_ref().unwrap_or(&no_status);
    let spec = pod.spec.as_ref();
    let init_specs = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"))
    };
    let condition_true = |type_: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == type_ && c.status == "True")
    };
    let mut total = spec.map_or(0, |s| s.containers.len());
    total += init_specs
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .count();
    let (mut ready, mut restarts, mut sidecar_restarts) = (0, 0, 0);
    let mut reason = non_empty(status.reason.as_deref())
        .or(status.phase.as_deref())
        .unwrap_or_default()
        .to_owned();
    let gated = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"));
    if gated {
        reason = "SchedulingGated".into();
    }

    let mut initializing = false;
    let init_statuses = status.init_container_statuses.iter().flatten();
    for (i, c) in init_statuses.enumerate() {
        restarts += c.restart_count;
        if sidecar(&c.name) {
            sidecar_restarts += c.restart_count;
        }
        let (waiting, terminated) = states(c);
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if sidecar(&c.name) && c.started == Some(true) {
            ready += usize::from(c.ready);
            continue;
        }
        initializing = true;
        reason = if let Some(t) = terminated {
            format!("Init:{}", terminated_reason(t))
        } else if let Some(r) = waiting
            .and_then(|w| non_empty(w.reason.as_deref()))
            .filter(|r| *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        break;
    }

    if !initializing || condition_true("Initialized") {
        restarts = sidecar_restarts;
        let mut has_running = false;
        for c in status.container_statuses.iter().flatten().rev() {
            restarts += c.restart_count;
            let (waiting, terminated) = states(c);
            let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
            if let Some(r) = waiting.and_then(|w| non_empty(w.reason.as_deref())) {
                reason = r.to_owned();
            } else if let Some(t) = terminated {
                reason = terminated_reason(t);
            } else if c.ready && running {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if condition_true("Ready") {
                "Running"
            } else {
                "NotReady"
            }
            .into();
        }
    }

    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            reason = "Terminating".into();
        }
    }

    let ip = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .find(|ip| !ip.is_empty())
        .map(str::to_owned);
    PodColumns {
        ready: format!("{ready}/{total}"),
        status: reason,
        restarts,
        ip,
    }
}

type Waiting = k8s_openapi::api::core::v1::ContainerStateWaiting;
type Terminated = k8s_openapi::api::core::v1::ContainerStateTerminated;

fn states(c: &ContainerStatus) -> (Option<&Waiting>, Option<&Terminated>) {
    let state = c.state.as_ref();
    (
        state.and_then(|s| s.waiting.as_ref()),
        state.and_then(|s| s.terminated.as_ref()),
    )
}

/// `OOMKilled`, or `Signal:9` / `ExitCode:1` when the runtime gave no reason.
fn terminated_reason(t: &Terminated) -> String {
    match (non_empty(t.reason.as_deref()), t.signal.unwrap_or(0)) {
        (Some(r), _) => r.to_owned(),
        (None, 0) => format!("ExitCode:{}", t.exit_code),
        (None, signal) => format!("Signal:{signal}"),
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// kubectl's `duration.HumanDuration` of a number of seconds: `45s`, `3m4s`, `2d`, `3y`.
/// Seconds since the epoch of the pod's creation: `creationTimestamp` (API pods), else when
/// the agent first saw it (`kubernetes.io/config.seen`, static pods have no API timestamp).
fn created_at(pod: &Pod) -> Option<i64> {
    if let Some(t) = &pod.metadata.creation_timestamp {
        return Some(t.0.as_second());
    }
    let seen = pod
        .metadata
        .annotations
        .as_ref()?
        .get(ironlet::config::CONFIG_SEEN)?;
    seen.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h) = (s / 60, s / 3600);
    let (d, y) = (h / 24, h / (24 * 365));
    let two = |a: i64, ua: &str, b: i64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        two(m, "m", s % 60, "s")
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        two(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        two(d, "d", h % 24, "h")
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        two(y, "y", d % 365, "d")
    } else {
        format!("{y}y")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn cols(json: serde_json::Value) -> (String, String, i32) {
        let c = columns(&pod(json));
        (c.ready, c.status, c.restarts)
    }

    fn running(name: &str, ready: bool, restarts: i32) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "imageID": "", "ready": ready,
            "restartCount": restarts, "state": {"running": {}}})
    }

    fn waiting(name: &str, reason: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": reason}}})
    }

    fn terminated(name: &str, code: i32, reason: Option<&str>) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason}}})
    }

    fn spec(init: &[&str], containers: &[&str]) -> serde_json::Value {
        let c = |n: &&str| serde_json::json!({"name": n});
        serde_json::json!({
            "initContainers": init.iter().map(c).collect::<Vec<_>>(),
            "containers": containers.iter().map(c).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn a_running_pod_counts_ready_containers_and_sums_restarts() {
        let p = serde_json::json!({"spec": spec(&[], &["a", "b"]), "status": {
            "phase": "Running",
            "containerStatuses": [running("a", true, 2), running("b", false, 1)]}});
        assert_eq!(cols(p), ("1/2".into(), "Running".into(), 3));
    }

    #[test]
    fn a_waiting_container_gives_its_reason() {
        let p = serde_json::json!({"spec": spec(&[], &["a", "b"]), "status": {
            "phase": "Running",
            "containerStatuses": [waiting("a", "CrashLoopBackOff"), running("b", true, 0)]}});
        assert_eq!(cols(p).1, "CrashLoopBackOff");
    }

    #[test]
    fn init_containers_show_progress_then_their_failure() {
        let p = serde_json::json!({"spec": spec(&["i1", "i2"], &["a"]), "status": {
            "phase": "Pending",
            "initContainerStatuses": [terminated("i1", 0, Some("Completed")),
                                      waiting("i2", "PodInitializing")],
            "containerStatuses": [waiting("a", "PodInitializing")]}});
        assert_eq!(cols(p), ("0/1".into(), "Init:1/2".into(), 0));
        let p = serde_json::json!({"spec": spec(&["i1"], &["a"]), "status": {
            "phase": "Pending",
            "initContainerStatuses": [terminated("i1", 3, None)]}});
        assert_eq!(cols(p).1, "Init:ExitCode:3");
        let p = serde_json::json!({"spec": spec(&["i1"], &["a"]), "status": {
            "phase": "Pending",
            "initContainerStatuses": [waiting("i1", "CrashLoopBackOff")]}});
        assert_eq!(cols(p).1, "Init:CrashLoopBackOff");
    }

    #[test]
    fn finished_containers_show_completed_or_their_exit() {
        let p = serde_json::json!({"spec": spec(&[], &["a"]), "status": {
            "phase": "Succeeded",
            "containerStatuses": [terminated("a", 0, Some("Completed"))]}});
        assert_eq!(cols(p), ("0/1".into(), "Completed".into(), 0));
        let p = serde_json::json!({"spec": spec(&[], &["a"]), "status": {
            "phase": "Failed",
            "containerStatuses": [terminated("a", 137, Some("OOMKilled"))]}});
        assert_eq!(cols(p).1, "OOMKilled");
    }

    #[test]
    fn completed_with_a_container_still_running_is_running_only_when_ready() {
        let status = |ready: &str| {
            serde_json::json!({"spec": spec(&[], &["a", "b"]), "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": ready}],
            "containerStatuses": [running("a", true, 0), terminated("b", 0, Some("Completed"))]}})
        };
        assert_eq!(cols(status("True")).1, "Running");
        assert_eq!(cols(status("False")).1, "NotReady");
    }

    #[test]
    fn a_deleted_pod_is_terminating_unless_it_finished() {
        let p = |phase: &str| {
            serde_json::json!({
            "metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"},
            "spec": spec(&[], &["a"]),
            "status": {"phase": phase, "containerStatuses": [running("a", true, 0)]}})
        };
        assert_eq!(cols(p("Running")).1, "Terminating");
        assert_eq!(cols(p("Succeeded")).1, "Succeeded");
    }

    #[test]
    fn a_pod_reason_such_as_an_admission_rejection_is_shown() {
        let p = serde_json::json!({"spec": spec(&[], &["a"]), "status": {
            "phase": "Failed", "reason": "OutOfmemory"}});
        assert_eq!(cols(p), ("0/1".into(), "OutOfmemory".into(), 0));
    }

    #[test]
    fn ages_are_printed_as_kubectl_does() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (184, "3m4s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (7 * 3600 + 60, "7h1m"),
            (47 * 3600, "47h"),
            (2 * 86400, "2d"),
            (3 * 86400 + 5 * 3600, "3d5h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn the_table_aligns_columns_with_three_spaces() {
        let now: k8s_openapi::jiff::Timestamp = "2024-01-01T00:10:00Z".parse().unwrap();
        let now = now.as_second();
        let pods = [
            pod(serde_json::json!({
                "metadata": {"name": "web-node1", "namespace": "default",
                             "creationTimestamp": "2024-01-01T00:06:56Z"},
                "spec": spec(&[], &["a"]),
                "status": {"phase": "Running", "podIP": "10.0.0.5",
                           "containerStatuses": [running("a", true, 0)]}})),
            pod(serde_json::json!({
                "metadata": {"name": "db", "namespace": "kube-system"},
                "spec": spec(&[], &["a", "b"]),
                "status": {"phase": "Pending"}})),
        ];
        assert_eq!(
            table(&pods, true, false, now),
            "NAMESPACE     NAME        READY   STATUS    RESTARTS   AGE         IP\n\
             default       web-node1   1/1     Running   0          3m4s        10.0.0.5\n\
             kube-system   db          0/2     Pending   0          <unknown>   <none>\n"
        );
        let wide = table(&pods[..1], false, true, now);
        assert!(
            wide.starts_with("NAME        READY   STATUS    RESTARTS   AGE    IP         NODE\n")
        );
        assert!(wide.ends_with("10.0.0.5   <none>\n"), "{wide}");
    }

    #[test]
    fn a_static_pod_without_creation_timestamp_ages_from_when_the_agent_first_saw_it() {
        let now: k8s_openapi::jiff::Timestamp = "2024-01-01T00:10:00Z".parse().unwrap();
        let now = now.as_second();
        let pods = [pod(serde_json::json!({
            "metadata": {"name": "web-node1", "namespace": "default",
                         "annotations": {"kubernetes.io/config.seen": "2024-01-01T00:08:00Z"}},
            "spec": spec(&[], &["a"]),
            "status": {"phase": "Pending"}}))];
        let table = table(&pods, false, false, now);
        assert!(table.contains("   2m   "), "{table}");
    }
}

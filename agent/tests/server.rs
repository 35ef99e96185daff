//! The agent's socket server end to end: `serve` on a temporary root with a fake
//! [`PodsView`] (the view is the seam; the agent's own tests cover the real one), queried by
//! the real `ironlet pods` binary and by raw connections. No root needed.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ironlet::server::{client, serve, socket_path, Metrics, PodsView, Server, ServerError};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

struct FakeView {
    pods: Vec<Pod>,
    health: Mutex<Result<(), String>>,
}

impl PodsView for FakeView {
    fn pods(&self) -> Vec<Pod> {
        self.pods.clone()
    }
    fn health(&self) -> Result<(), String> {
        self.health.lock().unwrap().clone()
    }
}

/// A server on a temporary root, on a thread of its own; stopped and joined on drop.
struct Agent {
    root: tempfile::TempDir,
    view: Arc<FakeView>,
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    fn start() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let view = Arc::new(FakeView {
            pods: fixtures(),
            health: Mutex::new(Ok(())),
        });
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound) = std::sync::mpsc::channel();
        let socket = socket_path(root.path());
        let (v, m) = (Arc::clone(&view), Arc::clone(&metrics));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let server = Server::bind(&socket).expect("binding the socket");
                bound_tx.send(()).expect("test is waiting");
                server.serve(v, m, stopped).await;
            });
        });
        bound.recv().expect("the server thread bound its socket");
        Self {
            root,
            view,
            metrics,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn socket(&self) -> PathBuf {
        socket_path(self.root.path())
    }

    fn ironlet(&self, args: &[&str]) -> Output {
        ironlet(self.root.path(), args)
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread ends cleanly");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ironlet(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .output()
        .expect("ironlet runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn fixtures() -> Vec<Pod> {
    let created = "2020-01-01T00:00:00Z";
    let pods = serde_json::json!([
        {"metadata": {"name": "web-node1", "namespace": "default", "uid": "u1",
                      "creationTimestamp": created},
         "spec": {"nodeName": "node1", "containers": [{"name": "app"}, {"name": "log"}]},
         "status": {"phase": "Running", "podIP": "10.88.0.7", "podIPs": [{"ip": "10.88.0.7"}],
            "containerStatuses": [
              {"name": "app", "image": "busybox", "imageID": "sha256:1", "ready": true,
               "restartCount": 3, "state": {"running": {"startedAt": created}}},
              {"name": "log", "image": "busybox", "imageID": "sha256:1", "ready": false,
               "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
        {"metadata": {"name": "dns-node1", "namespace": "kube-system", "uid": "u2",
                      "creationTimestamp": created},
         "spec": {"containers": [{"name": "dns"}]},
         "status": {"phase": "Running",
            "containerStatuses": [
              {"name": "dns", "image": "busybox", "imageID": "sha256:1", "ready": true,
               "restartCount": 0, "state": {"running": {"startedAt": created}}}]}}
    ]);
    serde_json::from_value(pods).expect("fixture pods")
}

/// Sends raw bytes, closes the sending side and returns the whole raw answer.
fn raw_exchange(socket: &Path, request: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.write_all(request).expect("send");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
}

#[test]
fn pods_lists_the_default_namespace_with_kubectl_columns() {
    let agent = Agent::start();
    let out = agent.ironlet(&["pods"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..4], ["web-node1", "1/2", "CrashLoopBackOff", "3"]);
    assert!(row[4].contains('y'), "age in years: {}", row[4]);
    assert_eq!(row[5], "10.88.0.7");
}

#[test]
fn pods_all_namespaces_adds_the_namespace_column() {
    let agent = Agent::start();
    let out = agent.ironlet(&["pods", "-A"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let firsts: Vec<(&str, &str)> = stdout
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap_or(""), w.next().unwrap_or(""))
        })
        .collect();
    assert_eq!(
        firsts,
        [
            ("NAMESPACE", "NAME"),
            ("default", "web-node1"),
            ("kube-system", "dns-node1")
        ]
    );
    let empty = agent.ironlet(&["pods", "-n", "nowhere"]);
    assert!(empty.status.success());
    assert_eq!(text(&empty.stdout), "");
    assert_eq!(
        text(&empty.stderr),
        "No resources found in nowhere namespace.\n"
    );
}

#[test]
fn pods_get_prints_the_full_pod_as_yaml_json_or_a_wide_row() {
    let agent = Agent::start();
    let out = agent.ironlet(&[
        "pods",
        "get",
        "dns-node1",
        "-n",
        "kube-system",
        "-o",
        "yaml",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let yaml = text(&out.stdout);
    assert!(yaml.starts_with("apiVersion: v1\nkind: Pod\n"), "{yaml}");
    let pod: Pod = serde_yaml::from_str(&yaml).expect("the output is a Pod");
    assert_eq!(pod, agent.view.pods[1]);

    let out = agent.ironlet(&["pods", "get", "web-node1", "-o", "json"]);
    let pod: Pod = serde_json::from_slice(&out.stdout).expect("the output is a Pod");
    assert_eq!(pod, agent.view.pods[0]);

    let out = agent.ironlet(&["pods", "get", "web-node1", "-o", "wide"]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.lines().next().unwrap().ends_with("IP          NODE"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("10.88.0.7   node1"), "{stdout}");
}

#[test]
fn pods_get_of_a_missing_pod_fails_naming_it() {
    let agent = Agent::start();
    let out = agent.ironlet(&["pods", "get", "missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "ironlet: pods \"missing\" not found in namespace \"default\"\n"
    );
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn without_an_agent_the_cli_says_none_is_running() {
    let root = tempfile::tempdir().unwrap();
    let out = ironlet(root.path(), &["pods"]);
    assert_eq!(out.status.code(), Some(1));
    let want = format!(
        "ironlet: no agent is running (cannot connect to {}): ",
        socket_path(root.path()).display()
    );
    assert!(
        text(&out.stderr).starts_with(&want),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_second_server_on_the_same_socket_is_refused_and_the_first_keeps_serving() {
    let agent = Agent::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let view: Arc<dyn PodsView> = agent.view.clone();
    let second = rt.block_on(serve(
        &agent.socket(),
        view,
        Arc::new(Metrics::new()),
        std::future::pending::<()>(),
    ));
    let err = second.expect_err("the socket is taken");
    assert!(matches!(err, ServerError::AlreadyRunning { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "another ironlet is running: {} accepts connections",
            agent.socket().display()
        )
    );
    assert_eq!(
        client::get(&agent.socket(), "/healthz").unwrap().body,
        b"ok"
    );
}

#[test]
fn malformed_requests_get_400_and_the_server_keeps_serving() {
    let agent = Agent::start();
    for garbage in [
        &b"\x00\x01\x02 nonsense\r\n\r\n"[..],
        b"GET /healthz HTTP/1.1\r\nbad header\r\n\r\n",
        // The body ends before its Content-Length.
        b"GET /pods HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
    ] {
        let answer = raw_exchange(&agent.socket(), garbage);
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
    }
    let huge = format!("GET /{} HTTP/1.1\r\n\r\n", "x".repeat(100_000));
    let mut stream = UnixStream::connect(agent.socket()).unwrap();
    // The server may answer and close before taking all of it; a failed write is fine.
    let _ = stream.write_all(huge.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    // A client that connects and sends nothing does not hold up the others.
    let _idle = UnixStream::connect(agent.socket()).unwrap();
    let resp = client::get(&agent.socket(), "/pods").unwrap();
    assert_eq!(resp.status, 200);
}

#[test]
fn healthz_and_metrics_reflect_the_agent_and_shutdown_removes_the_socket() {
    let mut agent = Agent::start();
    assert_eq!(
        client::get(&agent.socket(), "/healthz").unwrap().body,
        b"ok"
    );
    *agent.view.health.lock().unwrap() = Err("PLEG is not healthy".into());
    let resp = client::get(&agent.socket(), "/healthz").unwrap();
    assert_eq!(resp.status, 500);
    assert_eq!(
        text(&resp.body),
        "healthz check failed: PLEG is not healthy\n"
    );

    agent.metrics.running_pods.set(2.0);
    agent.metrics.pod_start_sli.observe(0.03);
    let resp = client::get(&agent.socket(), "/metrics").unwrap();
    let metrics = text(&resp.body);
    assert!(metrics.contains("\nkubelet_running_pods 2\n"), "{metrics}");
    assert!(metrics.contains("kubelet_pod_start_sli_duration_seconds_bucket{le=\"0.5\"} 1\n"));
    assert!(metrics.contains("\nprocess_resident_memory_bytes "));

    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(agent.socket()).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    agent.stop();
    assert!(
        !agent.socket().exists(),
        "the socket file is removed on shutdown"
    );
}

/// Runs `ironlet ARGS` with a stdout whose reader is already gone (`| head -0`).
fn ironlet_into_closed_pipe(root: &Path, args: &[&str]) -> Output {
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(root)
        .args(args)
        .stdout(writer)
        .output()
        .expect("ironlet runs")
}

#[test]
fn pods_exits_quietly_with_status_zero_when_its_reader_closes_early() {
    let agent = Agent::start();
    for args in [
        &["pods", "-A"][..],
        &["pods", "get", "web-node1", "-o", "yaml"],
    ] {
        let out = ironlet_into_closed_pipe(agent.root.path(), args);
        assert_eq!(
            text(&out.stderr),
            "",
            "{args:?}: nothing on stderr (no panic, no backtrace)"
        );
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
}

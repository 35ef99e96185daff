//! Behaviours the Kubernetes node conformance suite checks, end to end with real containers
//! under `ironlet run --pod-manifest-path`: container-level restart policies and rules,
//! a liveness probe's own termination grace period, a gRPC liveness probe against a health
//! server of the test (reached on the host network), `runAsNonRoot` refusals and unsafe
//! sysctl rejection. Needs root (CI runs as root); skips otherwise.

mod support;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use support::{container_status, phase, restart_count, Agent};

fn terminated<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStateTerminated> {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
}

fn running(pod: &Pod, name: &str) -> bool {
    container_status(pod, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

#[test]
fn container_restart_policies_and_rules_override_the_pod_policy() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "policies.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: policies}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: once
    image: busybox
    command: [sh, -c, "exit 3"]
    restartPolicy: Never
  - name: rules
    image: busybox
    command: [sh, -c, "if [ -f /data/ran ]; then exec sleep 3600; fi; touch /data/ran; exit 42"]
    restartPolicy: Never
    restartPolicyRules:
    - action: Restart
      exitCodes: {operator: In, values: [42]}
    volumeMounts: [{name: data, mountPath: /data}]
  - name: web
    image: busybox
    command: [sleep, "3600"]
  volumes:
  - name: data
    emptyDir: {}
"#,
    );
    let pod = agent.wait_pod(
        "policies",
        "rules restarted after exit 42",
        Duration::from_secs(60),
        |p| restart_count(p, "rules") == 1 && running(p, "rules") && running(p, "web"),
    );
    assert_eq!(phase(&pod), "Running");
    let once = terminated(&pod, "once").expect("once terminated");
    assert_eq!(once.exit_code, 3);
    assert_eq!(
        restart_count(&pod, "once"),
        0,
        "its own policy Never wins over the pod's Always"
    );
    // Still not restarted a while later.
    std::thread::sleep(Duration::from_secs(3));
    let pod = agent.pod("policies").expect("pod");
    assert_eq!(restart_count(&pod, "once"), 0);
    assert_eq!(terminated(&pod, "once").map(|t| t.exit_code), Some(3));
}

#[test]
fn a_liveness_kill_uses_the_probe_termination_grace_period() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    // The first container ignores SIGTERM and fails its liveness probe: only the probe's
    // 1 s grace period (not the pod's 60 s) gets it restarted quickly. The second one is
    // healthy and stops on SIGTERM.
    agent.write_manifest(
        "stubborn.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - name: app
    image: busybox
    command:
    - sh
    - -c
    - |
      if [ -f /data/ran ]; then touch /data/healthy; trap 'exit 0' TERM
      else touch /data/ran; trap '' TERM; fi
      while true; do sleep 1; done
    volumeMounts: [{name: data, mountPath: /data}]
    livenessProbe:
      exec: {command: [cat, /data/healthy]}
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    emptyDir: {}
"#,
    );
    agent.wait_pod("stubborn", "Running", Duration::from_secs(30), |p| {
        running(p, "app")
    });
    let started = Instant::now();
    agent.wait_pod(
        "stubborn",
        "restarted by liveness within the probe's grace period",
        // Far below the pod's 60 s: a probe, a 1 s grace, a start, on a loaded machine.
        Duration::from_secs(25),
        |p| restart_count(p, "app") == 1 && running(p, "app"),
    );
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[test]
fn a_container_with_run_as_non_root_and_a_root_image_is_refused_with_kubelets_message() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "nonroot.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: nonroot}
spec:
  securityContext: {runAsNonRoot: true}
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
"#,
    );
    let pod = agent.wait_pod(
        "nonroot",
        "CreateContainerConfigError",
        Duration::from_secs(30),
        |p| {
            container_status(p, "c")
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
        },
    );
    let waiting = container_status(&pod, "c")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .expect("waiting");
    let message = waiting.message.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "container has runAsNonRoot and image will run as root \
             (pod: \"{name}_default({uid})\", container: c)"
        )
    );
    assert!(
        agent.processes_in_tree().is_empty(),
        "the container never started"
    );
    assert!(
        agent
            .log()
            .contains("Error: container has runAsNonRoot and image will run as root"),
        "the Failed event names the reason"
    );
}

#[test]
fn a_pod_with_an_unsafe_sysctl_is_rejected_with_sysctl_forbidden() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "sysctl.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: sysctl}
spec:
  securityContext:
    sysctls:
    - {name: kernel.shm_rmid_forced, value: "1"}
    - {name: kernel.msgmax, value: "10000"}
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
"#,
    );
    let pod = agent.wait_pod("sysctl", "Failed", Duration::from_secs(15), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("SysctlForbidden"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted")
    );
    assert!(
        agent.processes_in_tree().is_empty(),
        "a rejected pod never starts"
    );
}

/// A `grpc.health.v1.Health` server on 127.0.0.1 answering every `Check` with the status in
/// `status` (1 SERVING, 2 NOT_SERVING); runs on `rt` until the runtime is dropped.
fn health_server(rt: &tokio::runtime::Runtime, status: Arc<AtomicU8>) -> u16 {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let status = status.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let mut body = request.into_body();
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    let head = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .body(())
                        .expect("response head");
                    let Ok(mut send) = respond.send_response(head, false) else {
                        continue;
                    };
                    // HealthCheckResponse { status = 1 } behind the 5-byte gRPC prefix.
                    let message = vec![0, 0, 0, 0, 2, 0x08, status.load(Ordering::SeqCst)];
                    let _ = send.send_data(bytes::Bytes::from(message), false);
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    let _ = send.send_trailers(trailers);
                }
            });
        }
    });
    port
}

#[test]
fn a_grpc_liveness_probe_keeps_a_serving_container_and_restarts_a_not_serving_one() {
    if !support::is_root() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let status = Arc::new(AtomicU8::new(1));
    let port = health_server(&rt, status.clone());
    let agent = Agent::start();
    agent.write_manifest(
        "grpc.yaml",
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: grpc}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    command: [sleep, "3600"]
    livenessProbe:
      grpc: {{port: {port}}}
      periodSeconds: 1
      failureThreshold: 1
"#
        ),
    );
    agent.wait_pod("grpc", "Running", Duration::from_secs(30), |p| {
        running(p, "app")
    });
    std::thread::sleep(Duration::from_secs(4));
    let pod = agent.pod("grpc").expect("pod");
    assert_eq!(restart_count(&pod, "app"), 0, "SERVING keeps it running");
    status.store(2, Ordering::SeqCst);
    agent.wait_pod(
        "grpc",
        "restarted by the gRPC liveness probe",
        Duration::from_secs(30),
        |p| restart_count(p, "app") >= 1,
    );
    status.store(1, Ordering::SeqCst);
}

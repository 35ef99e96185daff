//! Static pods end to end with real containers: `ironlet run --pod-manifest-path` boots,
//! restarts, probes, terminates and replaces pods, rejects what does not fit and skips
//! malformed manifests. Needs root (CI runs as root); skips otherwise.

mod support;

use std::time::{Duration, Instant};

use support::{condition, container_status, phase, restart_count, Agent, AgentOptions};

const WEB: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: init
    image: busybox
    command: [sh, -c, "echo init-done > /work/index.html"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: server
    image: busybox
    command: [httpd, -f, -p, "8080", -h, /work]
    volumeMounts: [{name: work, mountPath: /work}]
    readinessProbe:
      httpGet: {path: /index.html, port: 8080}
      periodSeconds: 1
  - name: sidecar
    image: busybox
    command: [sh, -c, "echo hello from $(POD_NAME); exec sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
  volumes:
  - name: work
    emptyDir: {}
"#;

/// A plain HTTP/1.0 GET; the body, or the error as text.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let attempt = || -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(stream, "GET {path} HTTP/1.0\r\n\r\n")?;
        let mut out = String::new();
        stream.read_to_string(&mut out)?;
        Ok(out)
    };
    attempt().unwrap_or_else(|e| format!("error: {e}"))
}

fn running_and_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    phase(pod) == "Running" && condition(pod, "Ready").as_deref() == Some("True")
}

fn container_id(pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> String {
    container_status(pod, name)
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("ironlet://").map(str::to_owned))
        .expect("container has an id")
}

/// Host pids of the processes in a container's cgroup.
fn pids_of(container_id: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cgroup.contains(container_id) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_pod_with_an_init_container_and_two_containers_comes_up_running() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest("web.yaml", WEB);
    let pod = agent.wait_pod(
        "web",
        "Running and Ready",
        Duration::from_secs(30),
        running_and_ready,
    );

    let status = pod.status.as_ref().expect("status");
    let init = container_status(&pod, "init").expect("init status");
    let done = init
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("init terminated");
    assert_eq!(done.exit_code, 0);
    assert_eq!(done.reason.as_deref(), Some("Completed"));
    for name in ["server", "sidecar"] {
        let c = container_status(&pod, name).expect("container status");
        assert!(c.ready, "{name} ready");
        assert!(
            c.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
            "{name} running"
        );
        assert_eq!(c.restart_count, 0);
        assert!(c
            .container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("ironlet://")));
        assert!(
            c.image_id.starts_with("sha256:") || c.image_id.contains("@sha256:"),
            "imageID {:?}",
            c.image_id
        );
    }
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(
            condition(&pod, kind).as_deref(),
            Some("True"),
            "condition {kind}"
        );
    }
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert!(status.start_time.is_some());
    assert!(status.host_ip.is_some());
    // The pod has an address on its CNI bridge, and the host reaches the server there.
    let ip = status.pod_ip.clone().expect("podIP from CNI");
    assert!(ip.starts_with("10.87."), "podIP {ip}");
    let body = http_get(&format!("{ip}:8080"), "/index.html");
    assert!(body.contains("init-done"), "GET / on the pod IP: {body:?}");

    // `ironlet pods` shows it as kubectl would.
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(agent.root.path())
        .arg("pods")
        .output()
        .expect("ironlet pods runs");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let row = table
        .lines()
        .find(|l| l.starts_with("web-e2e-node "))
        .unwrap_or_else(|| panic!("no row for the pod in:\n{table}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        columns.get(1..4),
        Some(&["2/2", "Running", "0"][..]),
        "{table}"
    );

    // The sidecar's output is in its CRI log with $(POD_NAME) expanded.
    let uid = pod.metadata.uid.clone().expect("uid");
    let log = agent
        .logs
        .join(format!("default_web-{}_{uid}", agent.node_name))
        .join("sidecar/0.log");
    agent.wait_until("the sidecar's log line", Duration::from_secs(5), |_| {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(" stdout F hello from web-e2e-node"))
    });
}

#[test]
fn a_killed_container_restarts_within_a_second_through_the_event_path() {
    if !support::is_root() {
        return;
    }
    // The relist is 60 s: only the pidfd event path can restart within a second.
    let agent = Agent::start();
    agent.write_manifest("web.yaml", WEB);
    let pod = agent.wait_pod("web", "Running", Duration::from_secs(30), running_and_ready);
    let id = container_id(&pod, "sidecar");
    let pids = pids_of(&id);
    assert!(!pids.is_empty(), "sidecar has processes");
    let killed_at = Instant::now();
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let pod = agent.wait_pod("web", "sidecar restarted", Duration::from_secs(10), |p| {
        restart_count(p, "sidecar") == 1 && support::running_pid_of(p, "sidecar") == Some(true)
    });
    let took = killed_at.elapsed();
    println!("sidecar restarted {took:?} after SIGKILL");
    assert!(took < Duration::from_secs(1), "restart took {took:?}");
    let last = container_status(&pod, "sidecar")
        .and_then(|c| c.last_state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .expect("lastState.terminated");
    assert_eq!(last.exit_code, 137);
    assert_ne!(container_id(&pod, "sidecar"), id, "a new container");
    assert_eq!(
        restart_count(&pod, "server"),
        0,
        "the other container is untouched"
    );
}

#[test]
fn a_crash_looping_container_backs_off_on_kubelets_schedule() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "crash.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  containers:
  - name: c
    image: busybox
    command: [sh, -c, "echo crashing; exit 3"]
"#,
    );
    // Restart 1 is immediate; restart 2 waits 10 s after the second exit; restart 3 20 s.
    let mut seen: Vec<(i32, Instant)> = Vec::new();
    let start = Instant::now();
    let mut backoff_messages: Vec<String> = Vec::new();
    while start.elapsed() < Duration::from_secs(45) && seen.len() < 4 {
        if let Some(pod) = agent.pod("crash") {
            let count = restart_count(&pod, "c");
            if count >= 0 && seen.last().map(|(c, _)| *c) != Some(count) {
                seen.push((count, Instant::now()));
            }
            if let Some(w) = container_status(&pod, "c")
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .filter(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            {
                if let Some(m) = &w.message {
                    if backoff_messages.last() != Some(m) {
                        backoff_messages.push(m.clone());
                    }
                }
                let last = container_status(&pod, "c").and_then(|c| c.last_state.clone());
                let code = last.and_then(|s| s.terminated).map(|t| t.exit_code);
                assert_eq!(code, Some(3), "lastState carries the exit code");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "restart counts seen: {:?}",
        seen.iter()
            .map(|(c, t)| (*c, t.duration_since(start)))
            .collect::<Vec<_>>()
    );
    let at = |n: i32| seen.iter().find(|(c, _)| *c == n).map(|(_, t)| *t);
    let (Some(t1), Some(t2), Some(t3)) = (at(1), at(2), at(3)) else {
        panic!(
            "expected restarts 1, 2 and 3 within 45 s, saw {seen:?}\n{}",
            support::tail(&agent.log(), 40)
        );
    };
    let gap2 = t2.duration_since(t1);
    let gap3 = t3.duration_since(t2);
    assert!(
        gap2 >= Duration::from_secs(9) && gap2 < Duration::from_secs(14),
        "second back-off {gap2:?}"
    );
    assert!(
        gap3 >= Duration::from_secs(19) && gap3 < Duration::from_secs(25),
        "third back-off {gap3:?}"
    );
    // The waiting message names each window in turn, in kubelet's words.
    let prefix = "restarting failed container=c pod=crash-e2e-node_default(";
    let windows: Vec<&str> = backoff_messages
        .iter()
        .filter_map(|m| m.strip_prefix("back-off "))
        .filter_map(|m| m.split_once(' '))
        .filter(|(_, rest)| rest.starts_with(prefix))
        .map(|(window, _)| window)
        .collect();
    assert_eq!(
        windows.get(..2),
        Some(&["10s", "20s"][..]),
        "{backoff_messages:?}"
    );
}

#[test]
fn a_failing_liveness_probe_restarts_the_container_and_readiness_drives_ready() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "probed.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: probed}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    command: [sh, -c, "touch /tmp/ready /tmp/alive; exec sleep 3600"]
    readinessProbe:
      exec: {command: [cat, /tmp/ready]}
      periodSeconds: 1
    livenessProbe:
      exec: {command: [cat, /tmp/alive]}
      periodSeconds: 1
      failureThreshold: 2
"#,
    );
    let pod = agent.wait_pod(
        "probed",
        "Ready",
        Duration::from_secs(30),
        running_and_ready,
    );
    let id = container_id(&pod, "app");
    // Readiness: removing the file flips Ready to False without a restart.
    run_in(&agent, &id, &["rm", "/tmp/ready"]);
    agent.wait_pod("probed", "not Ready", Duration::from_secs(10), |p| {
        condition(p, "Ready").as_deref() == Some("False") && restart_count(p, "app") == 0
    });
    // Liveness: removing the other file restarts the container; it is ready again after.
    run_in(&agent, &id, &["rm", "/tmp/alive"]);
    let pod = agent.wait_pod(
        "probed",
        "restarted by liveness",
        // Generous: two failed probes, the kill (grace 1 s) and a new start, on a loaded
        // 2-core machine running other tests beside this one.
        Duration::from_secs(45),
        |p| restart_count(p, "app") == 1 && running_and_ready(p),
    );
    assert_ne!(container_id(&pod, "app"), id);
}

/// `ironlet ctr exec` against the agent's data root.
fn run_in(agent: &Agent, id: &str, cmd: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(agent.root.path())
        .args(["ctr", "exec", id, "--"])
        .args(cmd)
        .output()
        .expect("ctr exec runs");
    assert!(
        out.status.success(),
        "exec {cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pre_stop_runs_before_sigterm_and_removing_the_manifest_leaves_nothing_behind() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    let marker_dir = agent.root.path().join("marker");
    std::fs::create_dir_all(&marker_dir).expect("marker dir");
    agent.write_manifest(
        "stopper.yaml",
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: stopper}}
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: app
    image: busybox
    command: [sh, -c, "trap 'echo term >> /m/order; exit 0' TERM; while true; do sleep 0.1; done"]
    volumeMounts: [{{name: m, mountPath: /m}}]
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo prestop >> /m/order"]}}
  volumes:
  - name: m
    hostPath: {{path: {}, type: Directory}}
"#,
            marker_dir.display()
        ),
    );
    let pod = agent.wait_pod("stopper", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    let uid = pod.metadata.uid.clone().expect("uid");
    assert!(!agent.processes_in_tree().is_empty());
    assert!(!agent.pod_cgroups().is_empty(), "the pod has a cgroup");
    agent.remove_manifest("stopper.yaml");
    agent.wait_until("the pod to disappear", Duration::from_secs(20), |a| {
        a.pod("stopper").is_none()
    });
    let order = std::fs::read_to_string(marker_dir.join("order")).unwrap_or_default();
    assert_eq!(order, "prestop\nterm\n", "preStop runs before SIGTERM");
    agent.wait_until(
        "no process, cgroup or mount left",
        Duration::from_secs(10),
        |a| {
            a.processes_in_tree().is_empty()
                && a.pod_cgroups().is_empty()
                && a.mounts_under_root().is_empty()
        },
    );
    assert!(
        !agent.root.path().join("pods").join(&uid).exists(),
        "pod directory removed"
    );
    assert!(
        !agent
            .logs
            .join(format!("default_stopper-{}_{uid}", agent.node_name))
            .exists(),
        "pod logs removed"
    );
}

#[test]
fn a_kubelet_configuration_file_gives_the_static_pod_path_and_unsupported_fields_are_named() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start_with(AgentOptions {
        config: Some("failSwapOn: false\nmaxPods: 5\n".into()),
        ..AgentOptions::default()
    });
    agent.write_manifest(
        "from-config.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: from-config}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, \"3600\"]\n",
    );
    agent.wait_pod("from-config", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    let log = agent.log();
    assert!(
        log.contains("not supported by ironlet") && log.contains("failSwapOn"),
        "the unsupported field is named at start: {log}"
    );
    assert!(!log.contains("maxPods"), "maxPods is supported: {log}");
    assert_eq!(
        log.matches("failSwapOn").count(),
        1,
        "said once, not again by the agent: {log}"
    );
    agent.remove_manifest("from-config.yaml");
    agent.wait_until("the pod is gone", Duration::from_secs(30), |a| {
        a.pods().is_empty() && a.processes_in_tree().is_empty()
    });
}

#[test]
fn editing_a_manifest_replaces_the_pod() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    let manifest = |msg: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: edit}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, \"echo {msg}; exec sleep 3600\"]\n"
        )
    };
    agent.write_manifest("edit.yaml", &manifest("one"));
    let first = agent.wait_pod("edit", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    agent.write_manifest("edit.yaml", &manifest("two"));
    let second = agent.wait_pod(
        "edit",
        "replaced and Running",
        Duration::from_secs(30),
        |p| phase(p) == "Running" && p.metadata.uid != first.metadata.uid,
    );
    agent.wait_until(
        "one pod only, one container running",
        Duration::from_secs(15),
        |a| a.pods().len() == 1 && a.processes_in_tree().len() == 1,
    );
    assert_ne!(first.metadata.uid, second.metadata.uid);
}

#[test]
fn an_orphaned_pod_log_directory_is_removed_while_live_and_ctr_ones_stay() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "live.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: live}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, \"3600\"]\n",
    );
    let live = agent.wait_pod("live", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    let meta = &live.metadata;
    let live_logs = agent.logs.join(format!(
        "{}_{}_{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    ));
    assert!(live_logs.is_dir(), "{} missing", live_logs.display());
    // What an agent killed between removing a deleted pod's sandbox and its logs leaves.
    let orphan = agent.logs.join("default_gone_0b7e6c1a-orphan");
    std::fs::create_dir_all(orphan.join("c")).expect("orphan dir");
    std::fs::write(orphan.join("c/0.log"), b"x\n").expect("orphan log");
    let ctr = agent.logs.join("ironlet-ctr_tool_5d1f0c2e");
    std::fs::create_dir_all(&ctr).expect("ctr dir");
    agent.wait_until("the orphan removed", Duration::from_secs(15), |_| {
        !orphan.exists()
    });
    assert!(live_logs.is_dir(), "the live pod's logs were removed");
    assert!(ctr.is_dir(), "a ctr container's logs were removed");
    std::fs::remove_dir(&ctr).expect("remove ctr dir");
}

#[test]
fn a_pod_that_does_not_fit_is_rejected_with_out_of_memory_and_never_started() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "huge.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
    resources: {requests: {memory: 100Ti}}
"#,
    );
    let pod = agent.wait_pod("huge", "Failed", Duration::from_secs(15), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("OutOfmemory"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("Insufficient memory") || message.contains("memory"),
        "{message}"
    );
    assert!(
        agent.processes_in_tree().is_empty(),
        "a rejected pod never starts"
    );
}

#[test]
fn a_malformed_manifest_is_reported_and_skipped_while_other_pods_keep_running() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "good.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec:\n  containers:\n  - {name: c, image: busybox, command: [sleep, '3600']}\n",
    );
    let good = agent.wait_pod("good", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    agent.write_manifest(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad\nspec: [\n",
    );
    agent.wait_until(
        "the bad manifest reported with its file",
        Duration::from_secs(15),
        |a| a.log().lines().any(|l| l.contains("bad.yaml")),
    );
    std::thread::sleep(Duration::from_secs(1));
    let still = agent.pod("good").expect("good pod still there");
    assert_eq!(phase(&still), "Running");
    assert_eq!(still.metadata.uid, good.metadata.uid);
    assert_eq!(restart_count(&still, "c"), 0);
    assert!(agent.pod("bad").is_none());
}

#[test]
fn a_pod_whose_container_fails_under_restart_policy_never_ends_failed() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start_with(AgentOptions::default());
    agent.write_manifest(
        "job.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: job}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: ok, image: busybox, command: [sh, -c, 'exit 0']}\n  - {name: bad, image: busybox, command: [sh, -c, 'sleep 0.2; exit 7']}\n",
    );
    let pod = agent.wait_pod("job", "Failed", Duration::from_secs(30), |p| {
        phase(p) == "Failed"
    });
    let bad = container_status(&pod, "bad")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated");
    assert_eq!(bad.exit_code, 7);
    assert_eq!(bad.reason.as_deref(), Some("Error"));
    assert_eq!(restart_count(&pod, "bad"), 0);
}

#[test]
fn termination_messages_come_from_the_file_or_the_log_tail_on_error() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "msg.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: msg}
spec:
  restartPolicy: Never
  containers:
  - name: file
    image: busybox
    command: [sh, -c, "echo -n 'disk full' > /dev/termination-log; exit 2"]
  - name: custom
    image: busybox
    terminationMessagePath: /tmp/why
    command: [sh, -c, "echo -n custom-path > /tmp/why; exit 0"]
  - name: fallback
    image: busybox
    terminationMessagePolicy: FallbackToLogsOnError
    command: [sh, -c, "echo first; echo last words; exit 1"]
"#,
    );
    let pod = agent.wait_pod("msg", "Failed", Duration::from_secs(30), |p| {
        phase(p) == "Failed"
    });
    let message = |name: &str| {
        container_status(&pod, name)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.clone())
    };
    assert_eq!(message("file").as_deref(), Some("disk full"));
    assert_eq!(message("custom").as_deref(), Some("custom-path"));
    assert_eq!(message("fallback").as_deref(), Some("first\nlast words"));
}

/// kubelet's eviction message for the `scratch` volume of [`FILLS_DISK`].
const EVICTION_MESSAGE: &str = "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ";

const FILLS_DISK: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: fills-disk}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: writer
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/scratch/fill bs=1M count=20; exec sleep 3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  - name: bystander
    image: busybox
    command: [sleep, "3600"]
  volumes:
  - name: scratch
    emptyDir: {sizeLimit: 1Mi}
"#;

#[test]
fn a_pod_filling_its_empty_dir_beyond_its_size_limit_is_evicted_and_not_restarted() {
    if !support::is_root() {
        return;
    }
    let mut agent = Agent::start();
    agent.write_manifest("fills-disk.yaml", FILLS_DISK);
    let started = Instant::now();
    let pod = agent.wait_pod("fills-disk", "Failed", Duration::from_secs(45), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(status.message.as_deref(), Some(EVICTION_MESSAGE));
    // Killed with kubelet's 1 s eviction grace, not the pod's 30 s.
    agent.wait_until(
        "the evicted pod's containers are gone",
        Duration::from_secs(15),
        |a| a.processes_in_tree().is_empty(),
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "eviction took {:?}",
        started.elapsed()
    );
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("Evicted") && l.contains("exceeds the limit")),
        "no Evicted event in the log"
    );
    std::thread::sleep(Duration::from_secs(4));
    let after = agent
        .pod("fills-disk")
        .expect("the evicted pod is still listed");
    assert_eq!(phase(&after), "Failed");
    assert_eq!(
        after.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("Evicted")
    );
    assert_eq!(restart_count(&after, "writer"), 0);
    assert_eq!(restart_count(&after, "bystander"), 0);
    assert!(
        agent.processes_in_tree().is_empty(),
        "an evicted pod is not restarted"
    );
    // Nor by the next agent, which reads the same manifest.
    agent.restart();
    std::thread::sleep(Duration::from_secs(4));
    let later = agent.pod("fills-disk").expect("still listed");
    assert_eq!(phase(&later), "Failed");
    assert_eq!(
        later.status.as_ref().and_then(|s| s.message.as_deref()),
        Some(EVICTION_MESSAGE)
    );
    assert!(
        agent.processes_in_tree().is_empty(),
        "the next agent restarted an evicted pod"
    );
}

/// A container over its own `ephemeral-storage` limit while its pod is within the sum (the
/// pod check comes first, as in kubelet: a one-container pod gets the pod's message); a pod
/// over the sum of its containers' limits though each container is within its own (the
/// emptyDir counts for the pod); a pod within its limits.
const STORAGE_LIMITED: [(&str, &str); 3] = [
    (
        "over-container",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: over-container}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: writer
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/big bs=1M count=4; exec sleep 3600"]
    resources: {limits: {ephemeral-storage: 1Mi}}
  - name: roomy
    image: busybox
    command: [sleep, "3600"]
    resources: {limits: {ephemeral-storage: 16Mi}}
"#,
    ),
    (
        "over-pod",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: over-pod}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: a
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/big bs=512k count=3; exec sleep 3600"]
    resources: {limits: {ephemeral-storage: 2Mi}}
  - name: b
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/scratch/big bs=1M count=3; exec sleep 3600"]
    resources: {limits: {ephemeral-storage: 2Mi}}
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - {name: scratch, emptyDir: {}}
"#,
    ),
    (
        "within",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: within}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: writer
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/big bs=1M count=1; exec sleep 3600"]
    resources: {limits: {ephemeral-storage: 8Mi}}
"#,
    ),
];

#[test]
fn pods_over_their_ephemeral_storage_limits_are_evicted_with_kubelets_messages() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    for (name, yaml) in STORAGE_LIMITED {
        agent.write_manifest(&format!("{name}.yaml"), yaml);
    }
    let evicted = |name: &str| {
        let pod = agent.wait_pod(name, "Failed", Duration::from_secs(60), |p| {
            phase(p) == "Failed"
        });
        let status = pod.status.clone().expect("status");
        assert_eq!(status.reason.as_deref(), Some("Evicted"), "{name}");
        status.message.unwrap_or_default()
    };
    assert_eq!(
        evicted("over-container"),
        "Container writer exceeded its local ephemeral storage limit \"1Mi\". "
    );
    assert_eq!(
        evicted("over-pod"),
        "Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. "
    );
    let within = agent
        .pod("within")
        .expect("the pod within its limits is listed");
    assert_eq!(phase(&within), "Running");
    assert_eq!(restart_count(&within, "writer"), 0);
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("Evicted") && l.contains("exceeded its local ephemeral storage")),
        "no Evicted event in the log"
    );
    // Killed with kubelet's 1 s eviction grace, not the pods' 30 s: only `within` is left.
    agent.wait_until(
        "the evicted pods' containers are gone",
        Duration::from_secs(15),
        |a| a.processes_in_tree().len() == 1,
    );
    for (name, _) in STORAGE_LIMITED {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.wait_until("every pod gone", Duration::from_secs(30), |a| {
        a.processes_in_tree().is_empty()
    });
}

#[test]
fn a_memory_empty_dir_refuses_writes_beyond_its_size_limit() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest(
        "tmpfs.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: tmpfs}
spec:
  restartPolicy: Never
  containers:
  - name: writer
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/m/fill bs=1M count=8; echo rc=$?; echo size=$(stat -c %s /m/fill)"]
    volumeMounts: [{name: m, mountPath: /m}]
  volumes:
  - name: m
    emptyDir: {medium: Memory, sizeLimit: 2Mi}
"#,
    );
    let pod = agent.wait_pod("tmpfs", "Succeeded", Duration::from_secs(30), |p| {
        phase(p) == "Succeeded"
    });
    let lines = agent.log_lines(&pod, "writer");
    let value = |key: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    assert_ne!(value("rc="), Some(0), "the write succeeded: {lines:?}");
    let size = value("size=").unwrap_or_else(|| panic!("no size in {lines:?}"));
    assert!(size <= 2 << 20, "wrote {size} bytes into a 2Mi tmpfs");
    assert!(size > 0, "nothing written: {lines:?}");
}

#[test]
fn a_failing_readiness_probe_records_an_unhealthy_event_with_its_output() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    // The output (`not-ready-2`) is not in the command's text, so the event shows it.
    agent.write_manifest(
        "unready.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: unready}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    command: [sleep, "3600"]
    readinessProbe:
      exec: {command: [sh, -c, "echo not-ready-$((1+1)); exit 1"]}
      periodSeconds: 1
"#,
    );
    agent.wait_until(
        "an Unhealthy event for the readiness probe",
        Duration::from_secs(30),
        |a| {
            a.log().lines().any(|l| {
                l.contains("Unhealthy")
                    && l.contains("Readiness probe failed: ")
                    && l.contains("not-ready-2")
            })
        },
    );
    let pod = agent.pod("unready").expect("the pod is listed");
    assert_eq!(phase(&pod), "Running");
    assert_eq!(condition(&pod, "Ready").as_deref(), Some("False"));
}

#[test]
fn pod_sysctls_are_set_in_the_pods_namespaces_and_not_on_the_host() {
    if !support::is_root() {
        return;
    }
    let host_file = "/proc/sys/kernel/shm_rmid_forced";
    let host_before = std::fs::read_to_string(host_file).expect("read the host's sysctl");
    // Each value differs from the host's, so reading it back proves it was set.
    let wanted = if host_before.trim() == "1" { "0" } else { "1" };
    let agent = Agent::start();
    agent.write_manifest(
        "sysctl.yaml",
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: sysctl}}
spec:
  restartPolicy: Never
  securityContext:
    sysctls: [{{name: kernel.shm_rmid_forced, value: "{wanted}"}}]
  containers:
  - name: read
    image: busybox
    command: [sh, -c, "tr -d '\\n' < {host_file} > /dev/termination-log"]
"#
        ),
    );
    let pod = agent.wait_pod("sysctl", "Succeeded", Duration::from_secs(30), |p| {
        phase(p) == "Succeeded"
    });
    let message = container_status(&pod, "read")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone());
    assert_eq!(message.as_deref(), Some(wanted), "the value inside the pod");
    assert_eq!(
        std::fs::read_to_string(host_file).expect("read the host's sysctl"),
        host_before,
        "the host's value changed"
    );
}

const DEADLINE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: deadline, namespace: default}
spec:
  activeDeadlineSeconds: 3
  terminationGracePeriodSeconds: 2
  containers:
  - name: sleeper
    image: busybox
    command: [sleep, "3600"]
"#;

#[test]
fn a_pod_past_its_active_deadline_ends_failed_with_deadline_exceeded_and_stops() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest("deadline.yaml", DEADLINE);
    agent.wait_pod("deadline", "Running", Duration::from_secs(30), |p| {
        phase(p) == "Running"
    });
    let running = Instant::now();
    let pod = agent.wait_pod("deadline", "Failed", Duration::from_secs(15), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    // Started at most a second or two before it was seen running; ended at its deadline,
    // not at the next periodic resync (a minute). The phase turns Failed once the container
    // has stopped (kubelet publishes no terminal phase while a container runs): the deadline
    // plus the 2 s grace period (`sleep`, PID 1, ignores SIGTERM).
    assert!(
        running.elapsed() < Duration::from_secs(8),
        "failed {:?} after running",
        running.elapsed()
    );
    agent.wait_until(
        "the pod's container is gone",
        Duration::from_secs(10),
        |a| a.processes_in_tree().is_empty(),
    );
    assert!(
        agent
            .log()
            .lines()
            .any(|l| l.contains("DeadlineExceeded")
                && l.contains("longer than the specified deadline")),
        "no DeadlineExceeded event in the log"
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = agent
        .pod("deadline")
        .expect("the failed pod is still listed");
    assert_eq!(phase(&after), "Failed");
    assert_eq!(restart_count(&after, "sleeper"), 0);
    assert!(
        agent.processes_in_tree().is_empty(),
        "a pod past its deadline is not restarted"
    );
    agent.remove_manifest("deadline.yaml");
}

/// A sidecar without limits keeps the pod cgroup unlimited: the kill happens under the
/// container's own 32Mi, which on cgroup v1 does not signal the pod cgroup's eventfd.
const OOM_IN_A_CONTAINER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: container-oom}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: limited
    image: busybox
    command: [sh, -c, "sleep 3; dd if=/dev/zero of=/dev/null bs=64M count=1; exec sleep 3600"]
    resources:
      requests: {memory: 16Mi}
      limits: {memory: 32Mi}
  - name: unlimited
    image: busybox
    command: [sleep, "3600"]
"#;

/// The pod's cgroup watcher sees an OOM kill of a process that is not a container's init,
/// under the container's own limit, at once (not at its minutes-apart safety re-check): on
/// v1 it registered the container cgroup created after the watch began.
#[test]
fn an_oom_kill_under_a_containers_own_limit_is_seen_at_once() {
    if !support::is_root() {
        return;
    }
    let agent = Agent::start();
    agent.write_manifest("container-oom.yaml", OOM_IN_A_CONTAINER);
    let pod = agent.wait_pod("container-oom", "Running", Duration::from_secs(60), |p| {
        phase(p) == "Running"
    });
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    agent.wait_until(
        "the pod cgroup's OOM kill is reported",
        Duration::from_secs(20),
        |a| {
            support::crash::strip_ansi(&a.log())
                .lines()
                .any(|l| l.contains("OOM kill") && l.contains(&format!("pod{uid} ")))
        },
    );
    let pod = agent.pod("container-oom").expect("listed");
    assert_eq!(phase(&pod), "Running");
    assert_eq!(
        restart_count(&pod, "limited"),
        0,
        "dd was the victim, not the init"
    );
}

//! Sidecar termination order and ephemeral containers on a real `ironlet run --kubeconfig`
//! joined to a real control plane (`scripts/controlplane`), driven through the real
//! kube-apiserver and `kubectl`:
//!
//! * a deleted pod's main container runs its preStop hook while its two sidecars still run
//!   (the conformance spec "prestop http hook" needs the sidecar it calls), then the main
//!   container gets SIGTERM, then the sidecars, the last-declared one first (kubelet's
//!   termination ordering); each container appends to a log in a hostPath on SIGTERM;
//! * a `restartPolicy: Never` pod whose main container exited stops its sidecar and ends
//!   Succeeded;
//! * `kubectl debug --target` adds an ephemeral container (`pods/ephemeralcontainers`): it
//!   runs in the target's PID namespace, reports `ephemeralContainerStatuses` (running,
//!   `containerID`, `imageID`, `image`), serves `kubectl logs -c` and `kubectl exec -c`; a
//!   second one that exits stays terminated (never restarted, under `restartPolicy: Always`),
//!   and the first one keeps running.
//!
//! One control plane and one agent serve every test of this binary; the tests use distinct
//! pod names. Needs root (containers, cgroups, CNI).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use ironlet_e2e::{block_on, eventually, run_suite, ClusterAgent, ControlPlane, SuiteTest};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
}

const TESTS: &[SuiteTest<Env>] = &[
    (
        "a_main_containers_pre_stop_hook_runs_while_its_sidecars_run_and_they_stop_after_it_in_reverse_order",
        sidecars_stop_last,
    ),
    (
        "a_restart_never_pod_whose_main_container_exited_stops_its_sidecar_and_succeeds",
        never_pod_with_sidecar_completes,
    ),
    (
        "kubectl_debug_starts_an_ephemeral_container_in_the_targets_pid_namespace_that_is_never_restarted",
        ephemeral_containers,
    ),
];

const TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    run_suite("cluster_sidecars", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(80));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    })
}

fn start() -> Result<Env> {
    let plane = ControlPlane::up()?;
    let node = format!("e2e-sidecars-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start(&kubeconfig, &node, std::process::id() % 250)?;
    Ok(Env { plane, agent })
}

async fn pods(env: &Env) -> Result<Api<Pod>> {
    Ok(Api::namespaced(env.plane.admin_client().await?, "default"))
}

/// Creates `pod`, retrying while the namespace's default ServiceAccount does not exist yet.
async fn create(pods: &Api<Pod>, pod: serde_json::Value) -> Result<()> {
    let pod: Pod = serde_json::from_value(pod)?;
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), &pod).await?;
        Ok(Some(()))
    })
    .await
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn statuses<'p>(
    pod: &'p Pod,
    list: fn(&'p k8s_openapi::api::core::v1::PodStatus) -> &'p Option<Vec<ContainerStatus>>,
) -> &'p [ContainerStatus] {
    pod.status
        .as_ref()
        .and_then(|s| list(s).as_deref())
        .unwrap_or_default()
}

fn find<'p>(list: &'p [ContainerStatus], name: &str) -> Option<&'p ContainerStatus> {
    list.iter().find(|c| c.name == name)
}

fn is_running(status: Option<&ContainerStatus>) -> bool {
    status
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

async fn wait_gone(pods: &Api<Pod>, name: &str) -> Result<()> {
    eventually(&format!("pod {name} gone"), TIMEOUT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// A host directory the pod writes its log into (`/out`), removed when dropped.
struct OutDir(PathBuf);

impl OutDir {
    fn new(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("sidecar-e2e-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A sidecar that appends `<name>-term` to /out/log on SIGTERM and exits.
fn recording_loop(name: &str) -> String {
    format!("trap 'echo {name}-term >> /out/log; exit 0' TERM; while true; do sleep 0.1; done")
}

fn sidecars_stop_last(env: &Env) -> Result<()> {
    let out = OutDir::new("order")?;
    block_on(async {
        let pods = pods(env).await?;
        // The hook waits 2 s so that a sidecar stopped at the same time has surely gone;
        // it records whether the sidecars still run then (they append on SIGTERM).
        let hook = "echo hook-start >> /out/log; sleep 2; \
                    if grep -q term /out/log; then echo hook-saw-a-stop >> /out/log; fi; \
                    echo hook-end >> /out/log";
        create(
            &pods,
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": "sidecar-order", "namespace": "default" },
                "spec": {
                    "nodeName": env.agent.node_name,
                    "terminationGracePeriodSeconds": 20,
                    "initContainers": [
                        { "name": "web", "image": "busybox", "imagePullPolicy": "Never",
                          "restartPolicy": "Always", "command": ["sh", "-c", recording_loop("web")],
                          "volumeMounts": [{ "name": "out", "mountPath": "/out" }] },
                        { "name": "logger", "image": "busybox", "imagePullPolicy": "Never",
                          "restartPolicy": "Always",
                          "command": ["sh", "-c", recording_loop("logger")],
                          "volumeMounts": [{ "name": "out", "mountPath": "/out" }] },
                    ],
                    "containers": [{
                        "name": "main", "image": "busybox", "imagePullPolicy": "Never",
                        "command": ["sh", "-c", recording_loop("main")],
                        "lifecycle": { "preStop": { "exec": { "command": ["sh", "-c", hook] } } },
                        "volumeMounts": [{ "name": "out", "mountPath": "/out" }],
                    }],
                    "volumes": [{ "name": "out", "hostPath": { "path": out.0 } }],
                },
            }),
        )
        .await?;
        let up = eventually("sidecar-order running", TIMEOUT, || async {
            let pod = pods.get("sidecar-order").await?;
            let main = find(statuses(&pod, |s| &s.container_statuses), "main");
            let init = statuses(&pod, |s| &s.init_container_statuses);
            let all = is_running(main)
                && is_running(find(init, "web"))
                && is_running(find(init, "logger"));
            Ok(all.then_some(()))
        })
        .await;
        if let Err(err) = up {
            let pod = pods.get("sidecar-order").await?;
            anyhow::bail!("{err:#}: {:?}", pod.status);
        }
        pods.delete("sidecar-order", &DeleteParams::default())
            .await?;
        wait_gone(&pods, "sidecar-order").await
    })?;
    let log = out.log();
    anyhow::ensure!(
        log == [
            "hook-start",
            "hook-end",
            "main-term",
            "logger-term",
            "web-term"
        ],
        "the pod's termination log: {log:?}"
    );
    Ok(())
}

fn never_pod_with_sidecar_completes(env: &Env) -> Result<()> {
    block_on(async {
        let pods = pods(env).await?;
        create(
            &pods,
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": "sidecar-job", "namespace": "default" },
                "spec": {
                    "nodeName": env.agent.node_name,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "initContainers": [{
                        "name": "proxy", "image": "busybox", "imagePullPolicy": "Never",
                        "restartPolicy": "Always",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
                    }],
                    "containers": [{
                        "name": "job", "image": "busybox", "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "sleep 2"],
                    }],
                },
            }),
        )
        .await?;
        let done = eventually("sidecar-job Succeeded", TIMEOUT, || async {
            let pod = pods.get("sidecar-job").await?;
            Ok((phase(&pod) == "Succeeded").then_some(pod))
        })
        .await?;
        let proxy = find(statuses(&done, |s| &s.init_container_statuses), "proxy");
        let stopped = proxy
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref());
        anyhow::ensure!(stopped.is_some(), "the sidecar was not stopped: {proxy:?}");
        let job = find(statuses(&done, |s| &s.container_statuses), "job");
        let code = job
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        anyhow::ensure!(code == Some(0), "job: {job:?}");
        pods.delete("sidecar-job", &DeleteParams::default()).await?;
        wait_gone(&pods, "sidecar-job").await
    })
}

fn ephemeral_containers(env: &Env) -> Result<()> {
    block_on(async {
        let pods = pods(env).await?;
        create(
            &pods,
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": "debuggee", "namespace": "default" },
                "spec": {
                    "nodeName": env.agent.node_name,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "main", "image": "busybox", "imagePullPolicy": "Never",
                        "command": ["sleep", "3611"],
                    }],
                },
            }),
        )
        .await?;
        eventually("debuggee running", TIMEOUT, || async {
            let pod = pods.get("debuggee").await?;
            let main = find(statuses(&pod, |s| &s.container_statuses), "main");
            Ok(is_running(main).then_some(()))
        })
        .await?;
        // PID 1 of the target's namespace is `sleep 3611`: the debugger sees it.
        let script = "echo polo; tr '\\0' ' ' < /proc/1/cmdline; echo; exec sleep 3612";
        env.plane.kubectl(&[
            "debug",
            "-n",
            "default",
            "debuggee",
            "--image=busybox",
            "--image-pull-policy=Never",
            "--target=main",
            "-c",
            "debugger",
            "--",
            "sh",
            "-c",
            script,
        ])?;
        let pod = eventually("the debugger running", TIMEOUT, || async {
            let pod = pods.get("debuggee").await?;
            let debugger = find(
                statuses(&pod, |s| &s.ephemeral_container_statuses),
                "debugger",
            );
            Ok(is_running(debugger).then_some(pod))
        })
        .await?;
        let debugger = find(
            statuses(&pod, |s| &s.ephemeral_container_statuses),
            "debugger",
        )
        .context("debugger status")?;
        anyhow::ensure!(
            debugger
                .container_id
                .as_deref()
                .is_some_and(|id| id.starts_with("ironlet://"))
                && !debugger.image_id.is_empty()
                && debugger.image == "busybox"
                && debugger.restart_count == 0,
            "debugger status: {debugger:?}"
        );
        anyhow::ensure!(
            find(statuses(&pod, |s| &s.container_statuses), "debugger").is_none(),
            "the ephemeral container is listed among the regular ones"
        );
        let logs = eventually("the debugger's log", TIMEOUT, || async {
            let logs = env
                .plane
                .kubectl(&["logs", "-n", "default", "debuggee", "-c", "debugger"])?;
            Ok(logs.contains("sleep 3611").then_some(logs))
        })
        .await?;
        anyhow::ensure!(logs.starts_with("polo\n"), "debugger log: {logs:?}");
        let echoed = env.plane.kubectl(&[
            "exec", "-n", "default", "debuggee", "-c", "debugger", "--", "echo", "marco",
        ])?;
        anyhow::ensure!(echoed.trim() == "marco", "exec: {echoed:?}");

        // A second one exits 3 and is never restarted; the first one keeps running.
        env.plane.kubectl(&[
            "debug",
            "-n",
            "default",
            "debuggee",
            "--image=busybox",
            "--image-pull-policy=Never",
            "-c",
            "once",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])?;
        eventually("once terminated with exit code 3", TIMEOUT, || async {
            let pod = pods.get("debuggee").await?;
            let once = find(statuses(&pod, |s| &s.ephemeral_container_statuses), "once");
            let code = once
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code);
            Ok((code == Some(3)).then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let pod = pods.get("debuggee").await?;
        let ephemeral = statuses(&pod, |s| &s.ephemeral_container_statuses);
        let once = find(ephemeral, "once").context("once status")?;
        let still_terminated = once
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 3);
        anyhow::ensure!(
            still_terminated && once.restart_count == 0,
            "once was restarted: {once:?}"
        );
        anyhow::ensure!(
            is_running(find(ephemeral, "debugger")),
            "debugger: {ephemeral:?}"
        );
        pods.delete("debuggee", &DeleteParams::default()).await?;
        wait_gone(&pods, "debuggee").await
    })
}

//! Graceful node shutdown against a real control plane (`scripts/controlplane`): an agent
//! with `--shutdown-grace-period=8s --shutdown-grace-period-critical-pods=3s` runs a regular
//! API pod (one container leaves on SIGTERM, one ignores it) and a critical one
//! (`priorityClassName: system-node-critical`); SIGPWR to the supervisor (the simulated
//! shutdown of a node without logind) makes
//! * the Node's `Ready` condition False (`KubeletNotReady`, "node is shutting down");
//! * the regular pod stop first: its preStop hook runs at once, the container ignoring
//!   SIGTERM is killed after the regular group's 5 s (not its own 30 s);
//! * the critical pod stop only after that (its preStop hook finds the regular pod's
//!   graceful container gone, and runs at least 4.5 s after SIGPWR), within the 8 s;
//! * both pods end `Failed`, reason `Terminated`, kubelet's message and a `DisruptionTarget`
//!   condition (`TerminationByKubelet`), and every container is terminated as soon as the
//!   phase is `Failed` (kubelet publishes no terminal phase while a container runs);
//! * a pod created afterwards is rejected (`NodeShutdown`).
//!
//! A second test kills the agent (-9) and sends SIGPWR to the supervisor at once: the
//! agent it starts next is told through `IRONLET_NODE_SHUTDOWN`, re-adopts the running static
//! pod and stops it (its mirror pod ends `Failed`, `Terminated`).
//!
//! The hooks and containers write markers into a hostPath directory the test reads.
//! Needs root; skips otherwise.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ironlet_e2e::{
    block_on, create_pod, eventually, run_suite, ClusterAgent, ControlPlane, SuiteTest,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::json;

const TEST: &str =
    "sigpwr_stops_regular_pods_then_critical_ones_within_the_grace_periods_and_marks_the_node_not_ready";
const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// Each test has its own control plane and agent (the environment is empty).
const TESTS: &[SuiteTest<()>] = &[
    (TEST, graceful_shutdown),
    (
        "an_agent_started_after_the_supervisor_got_sigpwr_stops_the_static_pods",
        told_at_start,
    ),
];

fn main() {
    run_suite("cluster_shutdown", TESTS, || Ok(()), |()| {});
}

/// The marker directory, removed when dropped.
struct Markers(PathBuf);

impl Drop for Markers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pod(
    name: &str,
    namespace: &str,
    node: &str,
    dir: &Path,
    spec: serde_json::Value,
) -> Result<Pod> {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "markers", "hostPath": {"path": dir, "type": "Directory"}}],
        },
    });
    if let (Some(target), Some(extra)) = (pod["spec"].as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    Ok(serde_json::from_value(pod)?)
}

fn container(name: &str, script: &str, pre_stop: Option<&str>) -> serde_json::Value {
    let mut c = json!({
        "name": name, "image": "busybox", "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "markers", "mountPath": "/markers"}],
    });
    if let Some(hook) = pre_stop {
        c["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c", hook]}}});
    }
    c
}

fn ready_condition(node: &Node) -> Option<(String, String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

/// Polls the marker directory until `file` exists; returns when it appeared.
fn wait_for_marker(dir: &Path, file: &str, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if dir.join(file).exists() {
            return Ok(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("{file} did not appear within {timeout:?}")
}

fn running(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.iter().flatten().all(|c| c.ready)
}

/// Phase Failed, reason Terminated, kubelet's message and the DisruptionTarget condition.
fn check_shutdown_status(pod: &Pod) -> Result<()> {
    let status = pod.status.clone().unwrap_or_default();
    anyhow::ensure!(
        status.phase.as_deref() == Some("Failed")
            && status.reason.as_deref() == Some("Terminated")
            && status.message.as_deref() == Some(SHUTDOWN_MESSAGE),
        "{:?}: {status:?}",
        pod.metadata.name
    );
    let target = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .context("no DisruptionTarget condition")?;
    anyhow::ensure!(
        target.status == "True"
            && target.reason.as_deref() == Some("TerminationByKubelet")
            && target.message.as_deref() == Some(SHUTDOWN_MESSAGE),
        "{target:?}"
    );
    Ok(())
}

fn graceful_shutdown((): &()) -> Result<()> {
    let plane = ControlPlane::up()?;
    let node_name = format!("e2e-shutdown-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node_name)?;
    let slot = std::process::id() % 250;
    let markers =
        Markers(std::env::temp_dir().join(format!("shutdown-e2e-{}", std::process::id())));
    std::fs::create_dir_all(&markers.0).context("creating the marker directory")?;
    let dir = markers.0.clone();
    let agent = ClusterAgent::start_with_args(
        &kubeconfig,
        &node_name,
        slot,
        &[
            "--shutdown-grace-period=8s".as_ref(),
            "--shutdown-grace-period-critical-pods=3s".as_ref(),
        ],
    )?;
    let result = block_on(async {
        let client = plane.admin_client().await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let default: Api<Pod> = Api::namespaced(client.clone(), "default");
        let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let regular = pod(
            "regular",
            "default",
            &node_name,
            &dir,
            json!({
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    container(
                        "graceful",
                        "trap 'touch /markers/regular-graceful-exited; exit 0' TERM; \
                         while true; do sleep 1; done",
                        Some("touch /markers/regular-prestop"),
                    ),
                    container("stubborn", "exec sleep 3600", None),
                ],
            }),
        )?;
        let critical = pod(
            "critical",
            "kube-system",
            &node_name,
            &dir,
            json!({
                "priorityClassName": "system-node-critical",
                "terminationGracePeriodSeconds": 30,
                "containers": [container(
                    "main",
                    "trap 'exit 0' TERM; while true; do sleep 1; done",
                    Some("if [ -e /markers/regular-graceful-exited ]; then echo after; \
                          else echo before; fi > /markers/critical-order; \
                          touch /markers/critical-prestop"),
                )],
            }),
        )?;
        create_pod(&default, &regular).await?;
        create_pod(&system, &critical).await?;
        for (api, name) in [(&default, "regular"), (&system, "critical")] {
            eventually(
                &format!("{name} running"),
                Duration::from_secs(90),
                || async { Ok(running(&api.get(name).await?).then_some(())) },
            )
            .await?;
        }
        let created = system.get("critical").await?;
        anyhow::ensure!(
            created.spec.as_ref().and_then(|s| s.priority) == Some(2_000_001_000),
            "system-node-critical priority: {:?}",
            created.spec.as_ref().and_then(|s| s.priority)
        );

        let sigpwr = Instant::now();
        agent.signal_supervisor(nix::sys::signal::Signal::SIGPWR)?;
        let dir2 = dir.clone();
        let seen = tokio::task::spawn_blocking(move || -> Result<_> {
            let regular_prestop =
                wait_for_marker(&dir2, "regular-prestop", Duration::from_secs(5))?;
            let critical_prestop =
                wait_for_marker(&dir2, "critical-prestop", Duration::from_secs(15))?;
            Ok((regular_prestop, critical_prestop))
        })
        .await??;
        let (regular_prestop, critical_prestop) = seen;
        eprintln!(
            "regular preStop after {:?}, critical preStop after {:?}",
            regular_prestop - sigpwr,
            critical_prestop - sigpwr
        );
        anyhow::ensure!(
            regular_prestop - sigpwr < Duration::from_secs(3),
            "the regular pod is stopped first, at once"
        );
        anyhow::ensure!(
            critical_prestop - sigpwr >= Duration::from_millis(4500),
            "the critical pod waits for the regular group's 5 s (its stubborn container): {:?}",
            critical_prestop - sigpwr
        );
        anyhow::ensure!(
            critical_prestop - sigpwr < Duration::from_secs(8),
            "the regular group is cut at 5 s, not the pod's 30 s: {:?}",
            critical_prestop - sigpwr
        );
        let order = std::fs::read_to_string(dir.join("critical-order")).unwrap_or_default();
        anyhow::ensure!(
            order.trim() == "after",
            "the critical preStop saw the regular pod still running: {order:?}"
        );

        let (status, reason, message) = eventually(
            "Ready=False on the Node",
            Duration::from_secs(10),
            || async {
                let node = nodes.get(&node_name).await?;
                Ok(ready_condition(&node).filter(|(s, _, _)| s == "False"))
            },
        )
        .await?;
        anyhow::ensure!(
            (status.as_str(), reason.as_str(), message.as_str())
                == ("False", "KubeletNotReady", "node is shutting down"),
            "{reason}: {message}"
        );

        for (api, name) in [(&default, "regular"), (&system, "critical")] {
            let stopped = eventually(
                &format!("{name} Failed"),
                Duration::from_secs(20),
                || async {
                    let pod = api.get(name).await?;
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                    Ok((phase.as_deref() == Some("Failed")).then_some(pod))
                },
            )
            .await?;
            check_shutdown_status(&stopped)?;
            let statuses = stopped
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            anyhow::ensure!(
                statuses
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some())),
                "{name}: every container terminated: {statuses:?}"
            );
        }
        // The critical pod's container ended within the whole grace period.
        anyhow::ensure!(
            sigpwr.elapsed() < Duration::from_secs(30),
            "took {:?}",
            sigpwr.elapsed()
        );

        let late = pod(
            "late",
            "default",
            &node_name,
            &dir,
            json!({"containers": [container("c", "sleep 3600", None)]}),
        )?;
        create_pod(&default, &late).await?;
        let rejected = eventually(
            "the late pod is rejected",
            Duration::from_secs(30),
            || async {
                let status = default.get("late").await?.status.unwrap_or_default();
                Ok((status.phase.as_deref() == Some("Failed")).then_some(status))
            },
        )
        .await?;
        anyhow::ensure!(
            rejected.reason.as_deref() == Some("NodeShutdown")
                && rejected.message.as_deref()
                    == Some("Pod was rejected: Pod was rejected as the node is shutting down."),
            "{rejected:?}"
        );

        for (api, name) in [
            (&default, "regular"),
            (&system, "critical"),
            (&default, "late"),
        ] {
            api.delete(name, &DeleteParams::default().grace_period(0))
                .await
                .with_context(|| format!("deleting {name}"))?;
        }
        for (api, name) in [
            (&default, "regular"),
            (&system, "critical"),
            (&default, "late"),
        ] {
            eventually(&format!("{name} gone"), Duration::from_secs(60), || async {
                Ok(api.get_opt(name).await?.is_none().then_some(()))
            })
            .await?;
        }
        Ok(())
    });
    if let Err(err) = result {
        eprintln!("agent log tail:\n{}", agent.log_tail(60));
        return Err(err);
    }
    drop(agent);
    drop(markers);
    Ok(())
}

/// A child of `parent` running `binary`.
fn child_running(parent: u32, binary: &Path) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent && std::fs::read_link(e.path().join("exe")).ok()? == binary).then_some(pid)
    })
}

/// The agent process: the supervisor's child running the same binary.
fn agent_pid(agent: &ClusterAgent) -> Option<i32> {
    let binary = agent.root.join("ironlet");
    let supervisor = child_running(std::process::id(), &binary)?;
    i32::try_from(child_running(supervisor, &binary)?).ok()
}

fn told_at_start((): &()) -> Result<()> {
    let plane = ControlPlane::up()?;
    let node_name = format!("e2e-shutdown-env-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node_name)?;
    let slot = (std::process::id() + 1) % 250;
    let agent = ClusterAgent::start_with_args(
        &kubeconfig,
        &node_name,
        slot,
        &[
            "--shutdown-grace-period=6s".as_ref(),
            "--shutdown-grace-period-critical-pods=2s".as_ref(),
        ],
    )?;
    let result = block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, "default");
        agent.write_manifest(
            "sleeper.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sleeper\n  namespace: default\nspec:\n  \
             containers:\n  - name: c\n    image: busybox\n    imagePullPolicy: Never\n    \
             command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n",
        )?;
        let name = format!("sleeper-{node_name}");
        eventually("the mirror pod runs", Duration::from_secs(90), || async {
            Ok(pods.get_opt(&name).await?.filter(running).map(|_| ()))
        })
        .await?;
        let pid = agent_pid(&agent).context("finding the agent process")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        agent.signal_supervisor(nix::sys::signal::Signal::SIGPWR)?;
        let stopped = eventually("the mirror pod Failed", Duration::from_secs(60), || async {
            let pod = pods.get(&name).await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            Ok((phase.as_deref() == Some("Failed")).then_some(pod))
        })
        .await?;
        check_shutdown_status(&stopped)?;
        anyhow::ensure!(
            agent
                .plain_log()
                .contains("the supervisor received SIGPWR before this agent started"),
            "the new agent was told at its start"
        );
        agent.remove_manifest("sleeper.yaml")?;
        eventually(
            "the mirror pod is gone",
            Duration::from_secs(60),
            || async { Ok(pods.get_opt(&name).await?.is_none().then_some(())) },
        )
        .await
    });
    if let Err(err) = result {
        eprintln!("agent log tail:\n{}", agent.log_tail(60));
        return Err(err);
    }
    drop(agent);
    Ok(())
}

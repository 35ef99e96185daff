//! A real `ironlet run --kubeconfig` restarted 20 times under 50 API pods (issue 15): kill -9
//! of the agent alternating with SIGHUP upgrades of the supervisor, while a watch records
//! every status of those pods the API server holds. The containers keep running throughout,
//! so no recorded status may differ in anything from the one before the first restart:
//! `ready`, `started`, `startedAt`, restart counts, conditions and their
//! `lastTransitionTime`, `startTime`, pod IPs. Half the pods have a readiness probe.
//!
//! Its own control plane and agent (the restarts would disturb other tests). Needs root.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use ironlet_e2e::{eventually, ClusterAgent, ControlPlane};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;

mod local;
use local::{agent_pid, local_get};

const TEST: &str = "fifty_api_pods_see_no_status_transition_across_20_agent_kills_and_upgrades";
const PODS: usize = 50;
const RESTARTS: usize = 20;

fn main() {
    let args = Arguments::from_args();
    let run = !args.list && nix::unistd::geteuid().is_root();
    let trial = Trial::test(TEST, move || {
        if !run {
            return Ok(());
        }
        tokio::runtime::Runtime::new()
            .map_err(|e| Failed::from(e.to_string()))?
            .block_on(test())
            .map_err(|e| Failed::from(format!("{e:#}")))
    })
    .with_ignored_flag(!run && !args.list);
    libtest_mimic::run(&args, vec![trial]).exit();
}

fn pod(name: &str, node: &str, label: &str, probed: bool) -> Result<Pod> {
    let mut container = json!({
        "name": "main",
        "image": "busybox",
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    });
    if probed {
        container["readinessProbe"] = json!({"exec": {"command": ["true"]}, "periodSeconds": 2});
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "labels": {"restart-test": label} },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }))?)
}

/// Restarts the agent — kill -9 of the agent process, or a SIGHUP upgrade — and returns
/// once a new agent answers.
fn restart(agent: &ClusterAgent, kill: bool) -> Result<()> {
    let old = agent_pid(agent).context("the agent does not answer /version")?;
    if kill {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(old),
            nix::sys::signal::Signal::SIGKILL,
        )
        .context("kill -9 the agent")?;
    } else {
        agent.signal_supervisor(nix::sys::signal::Signal::SIGHUP)?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if agent_pid(agent).is_some_and(|p| p != old) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("no new agent answered within 20 s")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn test() -> Result<()> {
    let began = Instant::now();
    let plane = ControlPlane::up()?;
    let node = format!("e2e-restarts-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start(&kubeconfig, &node, 250 + std::process::id() % 5)?;
    let client = plane.admin_client().await?;
    println!("control plane and agent up in {:?}", began.elapsed());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let label = format!("r{}", std::process::id());
    let selector = format!("restart-test={label}");
    let result = restarts(&agent, &pods, &node, &label, &selector).await;
    // Clean up whatever happened: delete the pods, wait until the agent removed them.
    let cleanup = Instant::now();
    let _ = pods
        .delete_collection(
            &DeleteParams::default().grace_period(1),
            &ListParams::default().labels(&selector),
        )
        .await;
    let gone = eventually("the pods are gone", Duration::from_secs(90), || async {
        let left = pods.list(&ListParams::default().labels(&selector)).await?;
        Ok(left.items.is_empty().then_some(()))
    })
    .await;
    println!("pods deleted in {:?}", cleanup.elapsed());
    if result.is_err() {
        eprintln!("agent log tail:\n{}", agent.log_tail(60));
    }
    drop(agent);
    drop(plane);
    result.and(gone)
}

async fn restarts(
    agent: &ClusterAgent,
    pods: &Api<Pod>,
    node: &str,
    label: &str,
    selector: &str,
) -> Result<()> {
    let name = |i: usize| format!("{label}-{i:02}");
    for i in 0..PODS {
        let pod = pod(&name(i), node, label, i % 2 == 0)?;
        // The ServiceAccount admission plugin refuses pods until `default` exists.
        eventually("the pod is created", Duration::from_secs(30), || async {
            pods.create(&PostParams::default(), &pod).await?;
            Ok(Some(()))
        })
        .await?;
    }
    let started = Instant::now();
    eventually("50 pods Ready", Duration::from_secs(120), || async {
        let list = pods.list(&ListParams::default().labels(selector)).await?;
        Ok((list.items.len() == PODS && list.items.iter().all(is_ready)).then_some(()))
    })
    .await?;
    println!("{PODS} pods Ready after {:?}", started.elapsed());
    // Let the last status patches land, then take the statuses every later one must equal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    let version = list
        .metadata
        .resource_version
        .clone()
        .context("list without resourceVersion")?;
    let baseline: BTreeMap<String, PodStatus> = list
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.status.unwrap_or_default(),
            )
        })
        .collect();

    let seen: Arc<Mutex<Vec<(String, PodStatus)>>> = Arc::default();
    let stream = pods
        .watch(
            &WatchParams::default().labels(selector).timeout(280),
            &version,
        )
        .await?;
    let recorder = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let pod = match event {
                    Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => pod,
                    Ok(WatchEvent::Deleted(pod)) => pod,
                    Ok(WatchEvent::Bookmark(_)) => continue,
                    Ok(WatchEvent::Error(e)) => return Err(anyhow::anyhow!("watch error: {e:?}")),
                    Err(e) => return Err(e.into()),
                };
                let status = pod.status.unwrap_or_default();
                let name = pod.metadata.name.unwrap_or_default();
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((name, status));
            }
            Ok(())
        }
    });

    let restarts_started = Instant::now();
    for round in 0..RESTARTS {
        restart(agent, round % 2 == 0)?;
        // Until the new agent reports every pod again (it re-adopted them and synced).
        eventually(
            "the pods reported again",
            Duration::from_secs(20),
            || async {
                let body = local_get(agent, "/pods").unwrap_or_default();
                let body = String::from_utf8_lossy(&body);
                Ok((body.matches(&format!("\"{label}-")).count() >= PODS).then_some(()))
            },
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{RESTARTS} restarts (kill -9 / SIGHUP alternating) in {:?}",
        restarts_started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    if recorder.is_finished() {
        recorder.await??;
        bail!("the watch ended early");
    }
    recorder.abort();

    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!(
        "the watch saw {} pod status(es) after the baseline",
        seen.len()
    );
    for (name, status) in &seen {
        let Some(before) = baseline.get(name) else {
            bail!("a status of unknown pod {name}");
        };
        if status != before {
            bail!(
                "pod {name}'s status changed in the API:\nbefore: {}\nafter:  {}",
                serde_json::to_string(before)?,
                serde_json::to_string(status)?
            );
        }
    }
    // And the final statuses are the baseline too (same containers: none restarted).
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    for pod in list.items {
        let name = pod.metadata.name.unwrap_or_default();
        if pod.status.as_ref() != baseline.get(&name) {
            bail!("pod {name}'s final status differs from the baseline");
        }
    }
    Ok(())
}

//! Node pressure against a real control plane (`scripts/controlplane`): an agent whose
//! `--eviction-hard=memory.available<1Ei` can never be met reports `MemoryPressure=True`
//! (`KubeletHasInsufficientMemory`) on its Node, records `EvictionThresholdMet` on the
//! Node, and rejects a BestEffort API pod with reason `Evicted`; the node lifecycle
//! controller of kube-controller-manager adds the `node.kubernetes.io/memory-pressure`
//! NoSchedule taint from the condition (the API server's NodeRestriction forbids a node to
//! change its own taints, so kubelet, and ironlet, leave taints to that controller).
//! Restarted with the default thresholds, the node reports `MemoryPressure=False` and the
//! taint goes. Needs root; skips otherwise.

use std::time::Duration;

use anyhow::{Context, Result};
use ironlet_e2e::{block_on, eventually, is_selected, ClusterAgent, ControlPlane};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;

const TEST: &str = "memory_pressure_sets_the_condition_the_taint_and_rejects_best_effort_pods";
const TAINT: &str = "node.kubernetes.io/memory-pressure";

fn main() {
    let args = Arguments::from_args();
    if args.list || !is_selected(&args, TEST) || !nix::unistd::geteuid().is_root() {
        let trials = vec![Trial::test(TEST, || Ok(())).with_ignored_flag(!args.list)];
        libtest_mimic::run(&args, trials).exit();
    }
    let trials = vec![Trial::test(TEST, || {
        memory_pressure().map_err(|e| Failed::from(format!("{e:#}")))
    })];
    libtest_mimic::run(&args, trials).exit();
}

fn condition(node: &Node, kind: &str) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"))
}

fn memory_pressure() -> Result<()> {
    let plane = ControlPlane::up()?;
    let node_name = format!("e2e-pressure-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node_name)?;
    let slot = std::process::id() % 250;
    let mut agent = ClusterAgent::start_with_args(
        &kubeconfig,
        &node_name,
        slot,
        &["--eviction-hard=memory.available<1Ei".as_ref()],
    )?;
    let result = block_on(async {
        let client = plane.admin_client().await?;
        let nodes: Api<Node> = Api::all(client.clone());
        eventually(
            "MemoryPressure=True on the Node",
            Duration::from_secs(60),
            || async {
                let node = nodes.get(&node_name).await?;
                Ok((condition(&node, "MemoryPressure")
                    == Some(("True".into(), "KubeletHasInsufficientMemory".into())))
                .then_some(()))
            },
        )
        .await?;
        eventually(
            "the memory-pressure taint",
            Duration::from_secs(60),
            || async { Ok(has_taint(&nodes.get(&node_name).await?).then_some(())) },
        )
        .await?;
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        eventually(
            "an EvictionThresholdMet node event",
            Duration::from_secs(30),
            || async {
                let list = events.list(&ListParams::default()).await?;
                Ok(list
                    .items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("EvictionThresholdMet")
                            && e.message.as_deref() == Some("Attempting to reclaim memory")
                            && e.involved_object.kind.as_deref() == Some("Node")
                            && e.involved_object.name.as_deref() == Some(node_name.as_str())
                    })
                    .then_some(()))
            },
        )
        .await?;

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "best-effort", "namespace": "default" },
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"]}],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let rejected = eventually("the pod is rejected", Duration::from_secs(60), || async {
            let pod = pods.get("best-effort").await?;
            let status = pod.status.unwrap_or_default();
            Ok((status.phase.as_deref() == Some("Failed")).then_some(status))
        })
        .await?;
        anyhow::ensure!(
            rejected.reason.as_deref() == Some("Evicted"),
            "{rejected:?}"
        );
        anyhow::ensure!(
            rejected.message.as_deref()
                == Some("Pod was rejected: The node had condition: [MemoryPressure]. "),
            "{rejected:?}"
        );
        pods.delete("best-effort", &DeleteParams::default().grace_period(0))
            .await
            .context("deleting the pod")?;
        Ok(())
    });
    if let Err(err) = result {
        eprintln!("agent log tail:\n{}", agent.log_tail(40));
        return Err(err);
    }
    // The same node with kubelet's default thresholds: no pressure, and the taint goes.
    agent.stop();
    drop(agent);
    let agent = ClusterAgent::start(&kubeconfig, &node_name, slot)?;
    let recovered = block_on(async {
        let nodes: Api<Node> = Api::all(plane.admin_client().await?);
        eventually(
            "MemoryPressure=False and no taint",
            Duration::from_secs(90),
            || async {
                let node = nodes.get(&node_name).await?;
                Ok((condition(&node, "MemoryPressure")
                    == Some(("False".into(), "KubeletHasSufficientMemory".into()))
                    && !has_taint(&node))
                .then_some(()))
            },
        )
        .await
    });
    if recovered.is_err() {
        eprintln!("agent log tail:\n{}", agent.log_tail(40));
    }
    drop(agent);
    recovered
}

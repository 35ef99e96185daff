//! What the API benchmarks share: the `ironlet` binary they start, the load average they
//! print, waiting for a node to be Ready, and what it runs (busybox pods of a script).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ironlet_e2e::eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::Client;

/// Sets `IRONLET_BIN` (what `ClusterAgent` starts) to the `ironlet` beside this executable
/// unless it is set. Call it before any thread exists.
pub fn ironlet_bin_beside_this() -> Result<()> {
    if std::env::var_os("IRONLET_BIN").is_none() {
        let exe = std::env::current_exe().context("locating this executable")?;
        let bin = exe.with_file_name("ironlet");
        ensure!(
            bin.exists(),
            "{} missing: cargo build --release -p ironlet, or set IRONLET_BIN",
            bin.display()
        );
        std::env::set_var("IRONLET_BIN", &bin);
    }
    Ok(())
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Waits (up to 120 s) until node `node` exists with the Ready condition True.
pub async fn wait_node_ready(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(
        &format!("node {node} Ready"),
        Duration::from_secs(120),
        || async {
            let Some(n) = nodes.get_opt(node).await? else {
                return Ok(None);
            };
            let ready = n
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok(ready.then_some(()))
        },
    )
    .await
}

/// `node NAME: kubelet VERSION runtime RUNTIME` from the node's status.
pub async fn describe_node(client: &Client, node: &str) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let info = nodes
        .get(node)
        .await?
        .status
        .and_then(|s| s.node_info)
        .context("node without nodeInfo")?;
    Ok(format!(
        "node {node}: kubelet {} runtime {}",
        info.kubelet_version, info.container_runtime_version
    ))
}

/// Deletes every pod matching `label` (1 s grace) and waits (up to 180 s) until the API has
/// none left, i.e. until their nodes confirmed the containers stopped.
pub async fn delete_labelled(pods: &Api<Pod>, label: &str) -> Result<()> {
    let params = DeleteParams::default().grace_period(1);
    let list = ListParams::default().labels(label);
    pods.delete_collection(&params, &list)
        .await
        .context("deleting the bench pods")?;
    eventually("every bench pod gone", Duration::from_secs(180), || async {
        Ok(pods.list(&list).await?.items.is_empty().then_some(()))
    })
    .await
}

/// A pod on `node` running `sh -c script` in busybox (container `main`, the imported image,
/// never restarted, 1 s grace) in `namespace`, labelled `key=value`.
pub fn busybox_pod(
    name: &str,
    namespace: &str,
    (key, value): (&str, &str),
    node: &str,
    script: &str,
) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "labels": { key: value } },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))?)
}

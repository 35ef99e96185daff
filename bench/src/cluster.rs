//! Node helpers the API benchmarks share: waiting for a node to be Ready, and what it runs.

use std::time::Duration;

use anyhow::{Context, Result};
use ironlet_e2e::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::Client;

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

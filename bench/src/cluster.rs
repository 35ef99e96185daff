//! Helpers of the benchmarks that run a control plane: the node's readiness and the host's
//! load average (printed with each step, since the machine is shared).

use std::time::Duration;

use anyhow::Result;
use ironlet_e2e::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::Client;

/// The 1, 5 and 15 minute load averages, `?` if unreadable.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Waits up to 120 s for node `node` to report the Ready condition True.
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

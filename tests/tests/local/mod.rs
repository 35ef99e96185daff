//! The agent's local socket (`<root>/ironlet.sock`) for end-to-end tests: its answers and
//! the pid of the agent process behind it.

use ironlet_e2e::ClusterAgent;

/// `GET path` on the agent's local socket; the body of a 200 answer.
pub fn local_get(agent: &ClusterAgent, path: &str) -> Option<Vec<u8>> {
    let resp = ironlet::server::client::get(&agent.root.join("ironlet.sock"), path).ok()?;
    (resp.status == 200).then_some(resp.body)
}

/// The pid of the agent process (the supervisor's child), from its `/version`.
pub fn agent_pid(agent: &ClusterAgent) -> Option<i32> {
    let version: serde_json::Value = serde_json::from_slice(&local_get(agent, "/version")?).ok()?;
    version
        .get("pid")?
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
}

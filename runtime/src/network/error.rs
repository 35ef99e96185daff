//! Errors of pod networking: reading the CNI configuration, finding and running plugins,
//! reading their results. Every plugin failure names the plugin, the CNI command and what
//! the plugin said (its JSON error `{"code","msg","details"}` and its stderr).

use std::path::PathBuf;
use std::time::Duration;

use super::cni::Command;

pub type Result<T, E = NetworkError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    // ---- configuration ----
    #[error("reading CNI configuration {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing CNI configuration {path}: {source}")]
    ParseConfig {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid CNI configuration {path}: {reason}")]
    InvalidConfig { path: PathBuf, reason: String },
    #[error("writing the default CNI configuration {path}: {source}")]
    WriteDefault {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pod network masquerade: {command}: {reason}")]
    Masquerade { command: String, reason: String },
    #[error("{0}")]
    Rootless(String),
    #[error("CNI plugin {plugin:?} not found in {dirs:?}")]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },

    // ---- running a plugin ----
    #[error("starting CNI plugin {plugin} ({command}): {source}")]
    Spawn {
        plugin: String,
        command: Command,
        #[source]
        source: std::io::Error,
    },
    #[error("CNI plugin {plugin} ({command}) did not finish within {after:?}")]
    Timeout {
        plugin: String,
        command: Command,
        after: Duration,
    },
    #[error("CNI plugin {plugin} ({command}) failed{}: {msg}{}{}",
        code.map(|c| format!(" with code {c}")).unwrap_or_default(),
        if details.is_empty() { String::new() } else { format!(" ({details})") },
        if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") })]
    Plugin {
        plugin: String,
        command: Command,
        /// The CNI error code, when the plugin printed a JSON error.
        code: Option<u32>,
        msg: String,
        details: String,
        stderr: String,
    },
    #[error("CNI plugin {plugin} ({command}) printed an unreadable result: {source}")]
    BadResult {
        plugin: String,
        command: Command,
        #[source]
        source: serde_json::Error,
    },
    #[error("CNI network {network} gave the pod no IP address")]
    NoAddress { network: String },

    // ---- rollback ----
    #[error("{original}; removing the pod from the network also failed: {cleanup}")]
    Rollback {
        original: Box<NetworkError>,
        cleanup: Box<NetworkError>,
    },
}

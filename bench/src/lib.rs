//! What the benchmark binaries share (`cluster`, `stats`, `peer_bundle`, `peer_node`,
//! `debian_image`, `registry_hosts`, and here their command-line count and tokio runtime);
//! each binary's module docs say what it measures.

pub mod cluster;
pub mod debian_image;
pub mod peer_bundle;
pub mod peer_node;
pub mod registry_hosts;
pub mod stats;

use anyhow::Context;

/// The first command-line argument as a count (`what` names it in the error: `WHAT must be
/// a number`), else `default`.
pub fn count_arg(what: &str, default: usize) -> anyhow::Result<usize> {
    Ok(std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .with_context(|| format!("{what} must be a number"))?
        .unwrap_or(default))
}

/// The benchmarks' tokio runtime: multi-threaded with two workers (this machine's cores).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

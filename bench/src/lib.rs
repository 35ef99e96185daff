//! What the benchmark binaries share (`cluster`, `stats`, `peer_bundle`); each binary's module docs say what it measures.

pub mod cluster;
pub mod peer_bundle;
pub mod stats;

//! What the benchmark binaries share (`cluster`, `stats`, `peer_bundle`, `peer_node`); each binary's module docs say what it measures.

pub mod cluster;
pub mod peer_bundle;
pub mod peer_node;
pub mod stats;

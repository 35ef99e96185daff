//! What the benchmark binaries share (`stats`, `peer_bundle`, `peer_node`); each binary's module docs say what it measures.

pub mod peer_bundle;
pub mod peer_node;
pub mod stats;

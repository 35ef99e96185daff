//! What the benchmark binaries share (`stats`, `peer_bundle`); each binary's module docs say what it measures.

pub mod peer_bundle;
pub mod stats;

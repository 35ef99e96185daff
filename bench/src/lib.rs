//! What the benchmark binaries share (`cluster`, `stats`, `peer_bundle`, `peer_node`, `debian_image`, `registry_hosts`); each binary's module docs say what it measures.

pub mod cluster;
pub mod debian_image;
pub mod peer_bundle;
pub mod peer_node;
pub mod registry_hosts;
pub mod stats;

//! ironlet's node agent: pod sources, pod manager, admission, pod workers, PLEG, status.
//!
//! The binary (`main.rs`) parses flags and forks the zygote; everything else lives here so
//! that tests can drive it.

pub mod admission;
pub mod config;
pub mod env;
pub mod objects;
pub mod pod_manager;
pub mod probes;
pub mod qos;
pub mod pod_cache;
pub mod pod_workers;
#[cfg(test)]
pub(crate) mod testing;
pub mod pleg;
pub mod kubelet;
pub mod server;
pub mod sync;
pub mod volumes;
pub mod status;

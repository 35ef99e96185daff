//! ironlet's node agent: pod sources, pod manager, admission, pod workers, PLEG, probes,
//! volumes, status and the local server.
//!
//! Where to start: [`kubelet::Kubelet`] wires everything together and runs the sync loop;
//! [`pod_workers`] holds the per-pod state machine and its contract. The binary
//! (`main.rs`) parses flags and forks the zygote; everything else lives here so that tests
//! and benchmarks can drive it.

pub mod admission;
pub mod apiserver;
pub mod config;
pub mod env;
pub mod kubelet;
pub mod node;
pub mod objects;
pub mod pleg;
pub mod pod_cache;
pub mod pod_manager;
pub mod pod_workers;
pub mod probes;
pub mod qos;
pub mod server;
pub mod status;
pub mod sync;
#[cfg(test)]
pub(crate) mod testing;
pub mod volumes;

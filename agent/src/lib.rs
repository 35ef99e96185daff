//! ironlet's node agent: pod sources, pod manager, admission, pod workers, PLEG, status.
//!
//! The binary (`main.rs`) parses flags and forks the zygote; everything else lives here so
//! that tests can drive it.

pub mod admission;
pub mod config;
pub mod node;
pub mod pod_manager;
pub mod qos;

//! ironlet-e2e: harnesses for the end-to-end tests in `tests/tests/`.
//!
//! * [`ControlPlane`]: a real kube-apiserver, scheduler, controller manager and etcd on
//!   127.0.0.1, started by `scripts/controlplane up` (which builds them from Go modules on a
//!   fresh machine) and stopped, state directory removed, when dropped.
//! * [`ClusterAgent`]: a real `ironlet run --kubeconfig` joined to it.
//! * [`eventually`]: poll until a condition holds, failing with what was awaited.
//! * [`run_suite`]: the `main` of a test binary sharing one environment.
//! * [`create_pod`], [`pod_condition`]: pod helpers.

mod agent;
mod controlplane;
mod pods;
mod suite;

pub use agent::{images_out, ironlet_binary, pids_in_tree, routable_host_ip, ClusterAgent};

pub use controlplane::{
    client_from_kubeconfig, describe, eventually, forwarded_port, script_down, ControlPlane,
};
pub use pods::{create_pod, pod_condition};
pub use suite::{block_on, is_selected, run_suite, SuiteTest};

//! The order in which a pod's running containers stop when the whole pod is killed —
//! kubelet's `terminationOrdering` (`kuberuntime_termination_order.go`), as a pure function.
//!
//! ```text
//!  regular containers ──all exited──► last-declared sidecar ──exited──► the one before … ► first
//!  (preStop hooks run at once;         (each sidecar's own preStop hook runs at once too;
//!   SIGTERM right after them)           its SIGTERM waits for its turn, within the grace period)
//!  init containers that are not sidecars, ephemeral containers: no turn to wait for
//! ```
//!
//! Only pods with a sidecar (an init container with `restartPolicy: Always`) are ordered;
//! in the others every container stops at once. A prerequisite that is not running is
//! already done (kubelet pre-closes its channel), so it is left out. As in kubelet, a sidecar
//! waits for the next-declared sidecar only, even when that one is not running.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use super::actions::ContainerKind;

/// For each running container name that must wait, the running container names it waits
/// for before it gets SIGTERM; empty when the pod has no sidecar.
#[must_use]
pub fn termination_prerequisites<'a>(
    pod: &Pod,
    running: impl IntoIterator<Item = &'a str>,
) -> HashMap<String, Vec<String>> {
    let running: HashSet<&str> = running.into_iter().collect();
    let Some(spec) = pod.spec.as_ref() else {
        return HashMap::new();
    };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let is_sidecar = |c: &&k8s_openapi::api::core::v1::Container| {
        ContainerKind::of_init(c) == ContainerKind::Sidecar
    };
    if !init.iter().any(|c| is_sidecar(&c)) {
        return HashMap::new();
    }
    let main: Vec<&str> = spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .filter(|name| running.contains(name))
        .collect();
    let mut prerequisites = HashMap::new();
    let mut later_sidecar: Option<&str> = None;
    for sidecar in init.iter().rev().filter(is_sidecar) {
        let name = sidecar.name.as_str();
        if running.contains(name) {
            let mut waits: Vec<String> = main.iter().map(|&m| m.to_owned()).collect();
            if let Some(later) = later_sidecar.filter(|l| running.contains(l)) {
                waits.push(later.to_owned());
            }
            prerequisites.insert(name.to_owned(), waits);
        }
        later_sidecar = Some(name);
    }
    prerequisites
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{pod, with_sidecar};
    use super::*;

    fn with_sidecars(p: Pod, names: &[&str]) -> Pod {
        names.iter().fold(p, |p, name| with_sidecar(p, name))
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn sidecars_wait_for_every_running_main_container_and_the_next_sidecar() {
        let p = with_sidecars(
            pod(&["proxy", "setup", "logger"], &["web", "worker"]),
            &["proxy", "logger"],
        );
        let pre = termination_prerequisites(&p, ["proxy", "logger", "web", "worker", "setup"]);
        assert_eq!(sorted(pre["logger"].clone()), ["web", "worker"]);
        assert_eq!(sorted(pre["proxy"].clone()), ["logger", "web", "worker"]);
        assert!(!pre.contains_key("web"), "main containers stop at once");
        assert!(
            !pre.contains_key("setup"),
            "plain init containers stop at once"
        );
    }

    #[test]
    fn containers_that_do_not_run_are_not_waited_for() {
        let p = with_sidecars(pod(&["a", "b"], &["web", "worker"]), &["a", "b"]);
        let pre = termination_prerequisites(&p, ["a", "worker"]);
        assert_eq!(pre["a"], ["worker"]);
        assert!(!pre.contains_key("b"));
        // The pod completed: only sidecars run, they stop at once (last one first).
        let pre = termination_prerequisites(&p, ["a", "b"]);
        assert_eq!(pre["b"], Vec::<String>::new());
        assert_eq!(pre["a"], ["b"]);
    }

    #[test]
    fn a_pod_without_sidecars_is_not_ordered() {
        let p = pod(&["setup"], &["web"]);
        assert!(termination_prerequisites(&p, ["setup", "web"]).is_empty());
    }
}

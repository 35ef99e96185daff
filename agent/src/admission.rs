//! Pod admission: may this node run this pod next to the pods it already admitted? kubelet's
//! predicate admit handler (`pkg/kubelet/lifecycle/predicate.go`), with its reasons and
//! messages, so that a rejected pod's status reads as it would under kubelet.
//!
//! Checks, in kubelet's order; the first failure is the verdict:
//!
//! | check                                             | reason                                 |
//! |---------------------------------------------------|----------------------------------------|
//! | a sysctl neither safe nor `--allowed-unsafe-sysctls` (or in a host namespace) | `SysctlForbidden` |
//! | pod label `kubernetes.io/os` names another OS     | `PodOSSelectorNodeLabelDoesNotMatch`   |
//! | `spec.os.name` is not `linux`                     | `PodOSNotSupported`                    |
//! | one more pod than `allocatable.pods`              | `OutOfpods`                            |
//! | CPU requests above what is left                   | `OutOfcpu`                             |
//! | memory requests above what is left                | `OutOfmemory`                          |
//! | nodeSelector / required node affinity             | `NodeAffinity`                         |
//! | `spec.nodeName` set to another node               | `NodeName`                             |
//! | a host port already bound by an admitted pod      | `NodePorts`                            |
//!
//! Resource messages are kubelet's `InsufficientResourceError`, e.g. `Node didn't have enough
//! resource: memory, requested: 3221225472, used: 0, capacity: 2147483648`; predicate messages
//! are its `PredicateFailureError`, e.g. `Predicate NodePorts failed: node(s) didn't have free
//! ports for the requested pod ports`.
//!
//! Requests are the pod's effective requests (`qos::pod_requests`: app containers and sidecars
//! summed, maxed with each init container, plus overhead). Already admitted pods in a terminal
//! phase (`Succeeded`, `Failed`) and the pod itself (same UID) do not count.
//!
//! Current behaviour: taints are not checked (kubelet only checks `NoExecute` taints for
//! non-static pods), nor extended resources and ephemeral storage.

mod affinity;
mod ports;
mod sysctls;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::config::pod_uid;
use crate::qos::{pod_requests, ResourceAmounts, ResourceError};

pub use affinity::matches_node;
pub use ports::{host_ports, HostPort};
pub use sysctls::{
    normalize as normalize_sysctl, SysctlAllowlist, SysctlNamespace, SysctlPatternError,
    SAFE_SYSCTLS,
};

/// What the node offers pods (the cgroups crate computes it from capacity minus reservations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeAllocatable {
    /// Millicores.
    pub cpu_milli: u64,
    /// Bytes.
    pub memory_bytes: u64,
    /// Maximum number of pods (kubelet `maxPods`, default 110).
    pub pods: u64,
}

/// The node as admission sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// What pods may use.
    pub allocatable: NodeAllocatable,
    /// The sysctls pods may set (the safe ones plus `--allowed-unsafe-sysctls`).
    pub sysctls: SysctlAllowlist,
}

/// A resource admission counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// CPU, in millicores.
    Cpu,
    /// Memory, in bytes.
    Memory,
    /// Number of pods.
    Pods,
}

impl Resource {
    /// The Kubernetes resource name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Memory => "memory",
            Self::Pods => "pods",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scheduling predicate kubelet re-checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Predicate {
    /// nodeSelector and required node affinity.
    NodeAffinity,
    /// `spec.nodeName`.
    NodeName,
    /// Host ports.
    NodePorts,
}

impl Predicate {
    /// The scheduler plugin name, which kubelet uses as the rejection reason.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::NodeAffinity => "NodeAffinity",
            Self::NodeName => "NodeName",
            Self::NodePorts => "NodePorts",
        }
    }

    /// The plugin's failure description.
    #[must_use]
    pub fn description(self) -> &'static str {
        match self {
            Self::NodeAffinity => "node(s) didn't match Pod's node affinity/selector",
            Self::NodeName => "node(s) didn't match the requested node name",
            Self::NodePorts => "node(s) didn't have free ports for the requested pod ports",
        }
    }
}

/// Why a pod was not admitted. `Display` is kubelet's message; [`Self::reason`] its reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitFailure {
    /// The pod's `kubernetes.io/os` label names another OS.
    #[error("Failed to admit pod as the `kubernetes.io/os` label doesn't match node label")]
    OsLabelMismatch,
    /// The pod's `spec.os.name` is not this node's OS.
    #[error("Failed to admit pod as the OS field doesn't match node OS")]
    OsNotSupported,
    /// Not enough of a resource is left.
    #[error("Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}")]
    InsufficientResource {
        /// The resource.
        resource: Resource,
        /// What the pod asks for.
        requested: u64,
        /// What admitted pods already use.
        used: u64,
        /// What the node offers.
        capacity: u64,
    },
    /// A scheduling predicate failed.
    #[error("Predicate {} failed: {}", .0.name(), .0.description())]
    Predicate(Predicate),
    /// A sysctl of the pod's security context is not allowed on this node.
    #[error("forbidden sysctl: {0}")]
    SysctlForbidden(String),
    /// The pod's requests could not be computed.
    #[error("Failed to admit pod: {0}")]
    Unexpected(#[source] ResourceError),
}

impl AdmitFailure {
    /// kubelet's single-word reason (`OutOfcpu`, `NodePorts`, …).
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::OsLabelMismatch => "PodOSSelectorNodeLabelDoesNotMatch",
            Self::OsNotSupported => "PodOSNotSupported",
            Self::InsufficientResource { resource, .. } => match resource {
                Resource::Cpu => "OutOfcpu",
                Resource::Memory => "OutOfmemory",
                Resource::Pods => "OutOfpods",
            },
            Self::Predicate(p) => p.name(),
            Self::SysctlForbidden(_) => "SysctlForbidden",
            Self::Unexpected(_) => "UnexpectedAdmissionError",
        }
    }
}

/// The verdict on one pod (kubelet `PodAdmitResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitResult {
    /// The pod may run.
    Admitted,
    /// The pod must not run, and why.
    Rejected(AdmitFailure),
}

impl AdmitResult {
    /// Whether the pod was admitted.
    #[must_use]
    pub fn admit(&self) -> bool {
        matches!(self, Self::Admitted)
    }

    /// kubelet's reason, when rejected.
    #[must_use]
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Admitted => None,
            Self::Rejected(failure) => Some(failure.reason()),
        }
    }

    /// kubelet's message; empty when admitted.
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Self::Admitted => String::new(),
            Self::Rejected(failure) => failure.to_string(),
        }
    }
}

/// The context of one decision (kubelet `PodAdmitAttributes`).
#[derive(Debug, Clone, Copy)]
pub struct PodAdmitAttributes<'a> {
    /// The pod to decide on.
    pub pod: &'a Pod,
    /// Every pod already admitted to the node (the pod itself, if listed, is ignored).
    pub other_pods: &'a [Arc<Pod>],
}

/// One admission check (kubelet `PodAdmitHandler`).
pub trait PodAdmitHandler: Send + Sync {
    /// Decides on `attrs.pod`.
    fn admit(&self, attrs: &PodAdmitAttributes<'_>) -> AdmitResult;
}

/// Runs `handlers` in order; the first rejection wins.
#[must_use]
pub fn admit_with(
    handlers: &[&dyn PodAdmitHandler],
    attrs: &PodAdmitAttributes<'_>,
) -> AdmitResult {
    handlers
        .iter()
        .map(|h| h.admit(attrs))
        .find(|r| !r.admit())
        .unwrap_or(AdmitResult::Admitted)
}

/// kubelet's predicate admit handler over the node returned by `node` at each decision.
pub struct PredicateAdmitHandler<F> {
    node: F,
}

impl<F: Fn() -> NodeInfo + Send + Sync> PredicateAdmitHandler<F> {
    /// A handler that asks `node` for the current node state.
    pub fn new(node: F) -> Self {
        Self { node }
    }
}

impl<F: Fn() -> NodeInfo + Send + Sync> PodAdmitHandler for PredicateAdmitHandler<F> {
    fn admit(&self, attrs: &PodAdmitAttributes<'_>) -> AdmitResult {
        admit(&(self.node)(), attrs.pod, attrs.other_pods)
    }
}

/// The OS this agent runs pods on.
const NODE_OS: &str = "linux";
const OS_LABEL: &str = "kubernetes.io/os";

/// Decides whether `pod` fits `node` next to `admitted`; see the module docs.
#[must_use]
pub fn admit(node: &NodeInfo, pod: &Pod, admitted: &[Arc<Pod>]) -> AdmitResult {
    let verdict = check(node, pod, admitted);
    if let Err(failure) = &verdict {
        tracing::info!(
            pod = %crate::config::pod_full_name(pod),
            pod_uid = %pod_uid(pod),
            reason = failure.reason(),
            message = %failure,
            "pod rejected by admission"
        );
    }
    verdict.map_or_else(AdmitResult::Rejected, |()| AdmitResult::Admitted)
}

fn check(node: &NodeInfo, pod: &Pod, admitted: &[Arc<Pod>]) -> Result<(), AdmitFailure> {
    check_sysctls(&node.sysctls, pod)?;
    let labels = pod.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get(OS_LABEL))
        .is_some_and(|os| os != NODE_OS)
    {
        return Err(AdmitFailure::OsLabelMismatch);
    }
    let spec = pod.spec.as_ref();
    if spec
        .and_then(|s| s.os.as_ref())
        .is_some_and(|os| os.name != NODE_OS)
    {
        return Err(AdmitFailure::OsNotSupported);
    }
    let uid = pod_uid(pod);
    let others: Vec<&Pod> = admitted
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| pod_uid(p) != uid && !is_terminal(p))
        .collect();
    check_resources(node, pod, &others)?;
    if !matches_node(pod, &node.name, &node.labels) {
        return Err(AdmitFailure::Predicate(Predicate::NodeAffinity));
    }
    let node_name = spec
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    if !node_name.is_empty() && node_name != node.name {
        return Err(AdmitFailure::Predicate(Predicate::NodeName));
    }
    let used: Vec<HostPort> = others.iter().flat_map(|p| host_ports(p)).collect();
    if ports::conflicts(pod, &used) {
        return Err(AdmitFailure::Predicate(Predicate::NodePorts));
    }
    Ok(())
}

/// kubelet's sysctl allowlist handler: the first sysctl refused rejects the pod.
fn check_sysctls(list: &SysctlAllowlist, pod: &Pod) -> Result<(), AdmitFailure> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref());
    let (host_network, host_ipc) = (
        spec.host_network.unwrap_or(false),
        spec.host_ipc.unwrap_or(false),
    );
    for sysctl in sysctls.into_iter().flatten() {
        list.validate(&sysctl.name, host_network, host_ipc)
            .map_err(AdmitFailure::SysctlForbidden)?;
    }
    Ok(())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The scheduler's `fitsRequest`: pod count, then CPU, then memory.
fn check_resources(node: &NodeInfo, pod: &Pod, others: &[&Pod]) -> Result<(), AdmitFailure> {
    let allocatable = node.allocatable;
    let pod_count = u64::try_from(others.len()).unwrap_or(u64::MAX);
    if pod_count.saturating_add(1) > allocatable.pods {
        return Err(AdmitFailure::InsufficientResource {
            resource: Resource::Pods,
            requested: 1,
            used: pod_count,
            capacity: allocatable.pods,
        });
    }
    let requested = pod_requests(pod).map_err(AdmitFailure::Unexpected)?;
    if requested.is_zero() {
        return Ok(());
    }
    let used = others.iter().fold(
        ResourceAmounts::default(),
        |sum, other| match pod_requests(other) {
            Ok(r) => ResourceAmounts {
                cpu_milli: sum.cpu_milli.saturating_add(r.cpu_milli),
                memory_bytes: sum.memory_bytes.saturating_add(r.memory_bytes),
            },
            Err(err) => {
                // Admitted pods passed validation, so this does not happen; count it as zero
                // rather than blocking every later pod.
                tracing::warn!(
                    pod = %crate::config::pod_full_name(other),
                    error = %err,
                    "admitted pod has unusable requests; counting them as zero",
                );
                sum
            }
        },
    );
    let checks = [
        (
            Resource::Cpu,
            requested.cpu_milli,
            used.cpu_milli,
            allocatable.cpu_milli,
        ),
        (
            Resource::Memory,
            requested.memory_bytes,
            used.memory_bytes,
            allocatable.memory_bytes,
        ),
    ];
    for (resource, requested, used, capacity) in checks {
        if requested > 0 && requested > capacity.saturating_sub(used) {
            return Err(AdmitFailure::InsufficientResource {
                resource,
                requested,
                used,
                capacity,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-1".into(),
            labels: [("disk".to_owned(), "ssd".to_owned())].into(),
            allocatable: NodeAllocatable {
                cpu_milli: 2000,
                memory_bytes: 2 * GI,
                pods: 110,
            },
            sysctls: SysctlAllowlist::default(),
        }
    }

    fn pod(uid: &str, spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p-{uid}, uid: {uid}}}\nspec:\n{spec}"
        ))
        .unwrap()
    }

    fn requesting(uid: &str, cpu: &str, memory: &str) -> Pod {
        pod(uid, &format!("  containers: [{{name: c, image: i, resources: {{requests: {{cpu: '{cpu}', memory: '{memory}'}}}}}}]\n"))
    }

    fn plain(uid: &str) -> Pod {
        pod(uid, "  containers: [{name: c, image: i}]\n")
    }

    fn verdict(p: &Pod, others: &[Pod]) -> AdmitResult {
        let others: Vec<Arc<Pod>> = others.iter().cloned().map(Arc::new).collect();
        admit(&node(), p, &others)
    }

    #[test]
    fn a_pod_that_fits_is_admitted() {
        let r = verdict(
            &requesting("a", "500m", "1Gi"),
            &[requesting("b", "1", "512Mi")],
        );
        assert_eq!(r, AdmitResult::Admitted);
        assert!(r.admit());
        assert_eq!((r.reason(), r.message()), (None, String::new()));
    }

    #[test]
    fn too_much_memory_is_out_of_memory_with_kubelets_message() {
        let r = verdict(&requesting("a", "100m", "3Gi"), &[]);
        assert_eq!(r.reason(), Some("OutOfmemory"));
        assert_eq!(
            r.message(),
            "Node didn't have enough resource: memory, requested: 3221225472, used: 0, capacity: 2147483648"
        );
    }

    #[test]
    fn cpu_used_by_admitted_pods_counts() {
        let r = verdict(
            &requesting("a", "1500m", "1Mi"),
            &[requesting("b", "1", "1Mi")],
        );
        assert_eq!(r.reason(), Some("OutOfcpu"));
        assert_eq!(
            r.message(),
            "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
        );
    }

    #[test]
    fn terminal_pods_and_the_pod_itself_do_not_count() {
        let mut done = requesting("b", "2", "1Mi");
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let me = requesting("a", "2", "1Mi");
        assert!(verdict(&me, &[done, me.clone()]).admit());
    }

    #[test]
    fn one_pod_too_many_is_out_of_pods_even_without_requests() {
        let mut n = node();
        n.allocatable.pods = 1;
        let r = admit(&n, &plain("a"), &[Arc::new(plain("b"))]);
        assert_eq!(r.reason(), Some("OutOfpods"));
        assert_eq!(
            r.message(),
            "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"
        );
    }

    #[test]
    fn pods_without_requests_skip_the_cpu_and_memory_checks() {
        let mut n = node();
        n.allocatable.cpu_milli = 0;
        n.allocatable.memory_bytes = 0;
        assert!(admit(&n, &plain("a"), &[]).admit());
    }

    #[test]
    fn resources_are_checked_before_predicates() {
        let p = pod("a", "  nodeName: other\n  containers: [{name: c, image: i, resources: {requests: {cpu: '64'}}}]\n");
        assert_eq!(verdict(&p, &[]).reason(), Some("OutOfcpu"));
    }

    #[test]
    fn a_node_selector_that_does_not_match_is_node_affinity() {
        let r = verdict(
            &pod(
                "a",
                "  nodeSelector: {disk: hdd}\n  containers: [{name: c, image: i}]\n",
            ),
            &[],
        );
        assert_eq!(r.reason(), Some("NodeAffinity"));
        assert_eq!(
            r.message(),
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        );
    }

    #[test]
    fn a_pod_bound_to_another_node_is_node_name() {
        let r = verdict(
            &pod(
                "a",
                "  nodeName: node-2\n  containers: [{name: c, image: i}]\n",
            ),
            &[],
        );
        assert_eq!(r.reason(), Some("NodeName"));
        assert_eq!(
            r.message(),
            "Predicate NodeName failed: node(s) didn't match the requested node name"
        );
        assert!(verdict(
            &pod(
                "b",
                "  nodeName: node-1\n  containers: [{name: c, image: i}]\n"
            ),
            &[]
        )
        .admit());
    }

    #[test]
    fn a_host_port_taken_by_an_admitted_pod_is_node_ports() {
        let web = |uid: &str, ip: &str| {
            pod(uid, &format!("  containers: [{{name: c, image: i, ports: [{{containerPort: 80, hostPort: 8080, hostIP: '{ip}'}}]}}]\n"))
        };
        let r = verdict(&web("a", ""), &[web("b", "10.0.0.1")]);
        assert_eq!(r.reason(), Some("NodePorts"));
        assert_eq!(r.message(), "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports");
        assert!(verdict(&web("a", "10.0.0.2"), &[web("b", "10.0.0.1")]).admit());
    }

    #[test]
    fn another_os_is_rejected_first() {
        let mut p = plain("a");
        p.metadata.labels = Some([("kubernetes.io/os".to_owned(), "windows".to_owned())].into());
        assert_eq!(
            verdict(&p, &[]).reason(),
            Some("PodOSSelectorNodeLabelDoesNotMatch")
        );
        let p = pod(
            "b",
            "  os: {name: windows}\n  containers: [{name: c, image: i}]\n",
        );
        assert_eq!(verdict(&p, &[]).reason(), Some("PodOSNotSupported"));
    }

    #[test]
    fn unusable_requests_are_an_unexpected_admission_error() {
        let r = verdict(&requesting("a", "lots", "1Mi"), &[]);
        assert_eq!(r.reason(), Some("UnexpectedAdmissionError"));
        assert!(
            r.message().contains(r#"container "c" requests.cpu"#),
            "{}",
            r.message()
        );
    }

    #[test]
    fn an_unsafe_sysctl_the_node_does_not_allow_is_sysctl_forbidden() {
        let unsafe_sysctl = pod(
            "a",
            "  securityContext: {sysctls: [{name: kernel.shm_rmid_forced, value: '0'}, \
             {name: kernel.msgmax, value: '10000'}]}\n  containers: [{name: c, image: i}]\n",
        );
        let verdict = admit(&node(), &unsafe_sysctl, &[]);
        assert_eq!(verdict.reason(), Some("SysctlForbidden"));
        assert_eq!(
            verdict.message(),
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        let mut allowing = node();
        allowing.sysctls = SysctlAllowlist::new(&["kernel.msg*"]).expect("valid pattern");
        assert!(admit(&allowing, &unsafe_sysctl, &[]).admit());
    }

    #[test]
    fn handlers_run_in_order_and_the_first_rejection_wins() {
        struct Always(AdmitResult);
        impl PodAdmitHandler for Always {
            fn admit(&self, _: &PodAdmitAttributes<'_>) -> AdmitResult {
                self.0.clone()
            }
        }
        let predicates = PredicateAdmitHandler::new(node);
        let deny = Always(AdmitResult::Rejected(AdmitFailure::OsNotSupported));
        let p = requesting("a", "3", "1Mi");
        let attrs = PodAdmitAttributes {
            pod: &p,
            other_pods: &[],
        };
        assert_eq!(
            admit_with(&[&predicates, &deny], &attrs).reason(),
            Some("OutOfcpu")
        );
        assert_eq!(
            admit_with(&[&deny, &predicates], &attrs).reason(),
            Some("PodOSNotSupported")
        );
        let small = requesting("b", "1", "1Mi");
        let attrs = PodAdmitAttributes {
            pod: &small,
            other_pods: &[],
        };
        assert!(admit_with(&[&predicates], &attrs).admit());
    }
}

//! A `v1.Container` of a pod → the runtime's [`ContainerConfig`]: command and args with
//! `$(VAR)` expansion, environment, mounts, cgroup resources, OOM score, security context,
//! log path and the kubelet labels the pod workers read back.

use std::collections::{BTreeMap, HashMap};

use ironlet_cgroups::{CgroupOptions, QosClass};
use ironlet_runtime::types::{
    ContainerConfig, LinuxResources, Mount, SeccompProfile, SecurityConfig,
};
use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile as ApiSeccomp};

use crate::qos::{container_requirements, ResourceError};

/// kubelet's OOM score adjustments (`pkg/kubelet/qos/policy.go`).
const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;

/// What the translation needs besides the container itself.
pub struct ContainerInputs<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub attempt: u32,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub qos: QosClass,
    pub node_memory_bytes: u64,
    pub cgroup_options: &'a CgroupOptions,
    pub seccomp_default: bool,
    /// Directory holding `Localhost` seccomp profiles (`<root>/seccomp`).
    pub seccomp_dir: &'a std::path::Path,
}

/// Builds the container's runtime config.
pub fn container_config(inputs: ContainerInputs<'_>) -> Result<ContainerConfig, ResourceError> {
    let ContainerInputs {
        pod,
        container,
        attempt,
        env,
        mounts,
        labels,
        annotations,
        qos,
        node_memory_bytes,
        cgroup_options,
        seccomp_default,
        seccomp_dir,
    } = inputs;
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let expand = |items: &Option<Vec<String>>| -> Vec<String> {
        items
            .iter()
            .flatten()
            .map(|s| crate::env::expand(s, &vars))
            .collect()
    };
    let requirements = container_requirements(container)?;
    let settings = requirements.container_settings(cgroup_options);
    let resources = LinuxResources {
        cpu_shares: settings.cpu_shares,
        cpu_quota: settings.cpu_quota,
        cpu_period: settings.cpu_period,
        memory_limit_bytes: settings.memory_limit,
        pids_limit: cgroup_options.pod_pids_limit,
        oom_score_adj: Some(oom_score_adj(
            qos,
            requirements.memory_request_bytes.unwrap_or(0),
            node_memory_bytes,
        )),
    };
    Ok(ContainerConfig {
        name: container.name.clone(),
        attempt,
        image: container.image.clone().unwrap_or_default(),
        command: expand(&container.command),
        args: expand(&container.args),
        working_dir: container.working_dir.clone().filter(|d| !d.is_empty()),
        env,
        mounts,
        resources,
        security: security_config(pod, container, seccomp_default, seccomp_dir),
        log_path: format!("{}/{attempt}.log", container.name).into(),
        labels,
        annotations,
        sysctls: pod_sysctls(pod),
        pid_namespace_target: None,
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
    })
}

/// The pod's `securityContext.sysctls`, dot-separated as kubelet hands them to the runtime
/// (admission has already refused the pods whose sysctls this node does not allow).
fn pod_sysctls(pod: &Pod) -> BTreeMap<String, String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (crate::admission::normalize_sysctl(&s.name), s.value.clone()))
        .collect()
}

/// kubelet's `GetContainerOOMScoreAdjust`.
fn oom_score_adj(qos: QosClass, memory_request: u64, memory_capacity: u64) -> i32 {
    match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            if memory_capacity == 0 {
                return BEST_EFFORT_OOM_SCORE_ADJ - 1;
            }
            let scaled = 1000u128 * u128::from(memory_request) / u128::from(memory_capacity);
            let adj = 1000 - i64::try_from(scaled).unwrap_or(1000);
            // Burstable stays strictly between Guaranteed and BestEffort.
            i32::try_from(adj.clamp(2, 999)).unwrap_or(999)
        }
    }
}

fn security_config(
    pod: &Pod,
    container: &Container,
    seccomp_default: bool,
    seccomp_dir: &std::path::Path,
) -> SecurityConfig {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let to_u32 = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| pod_sc.and_then(|s| s.seccomp_profile.as_ref()));
    let seccomp = match seccomp {
        Some(profile) => seccomp_profile(profile, seccomp_dir),
        None if seccomp_default && !privileged => SeccompProfile::RuntimeDefault,
        None => SeccompProfile::Unconfined,
    };
    SecurityConfig {
        privileged,
        read_only_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        run_as_user: to_u32(
            sc.and_then(|s| s.run_as_user)
                .or_else(|| pod_sc.and_then(|s| s.run_as_user)),
        ),
        run_as_group: to_u32(
            sc.and_then(|s| s.run_as_group)
                .or_else(|| pod_sc.and_then(|s| s.run_as_group)),
        ),
        // kubelet's order: the fsGroup first, then the pod's supplemental groups.
        supplemental_groups: pod_sc
            .and_then(|s| s.fs_group)
            .into_iter()
            .chain(
                pod_sc
                    .and_then(|s| s.supplemental_groups.as_ref())
                    .into_iter()
                    .flatten()
                    .copied(),
            )
            .filter_map(|g| u32::try_from(g).ok())
            .collect(),
        add_capabilities: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
        drop_capabilities: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
        // kubelet's `AddNoNewPrivileges`: only an explicit `allowPrivilegeEscalation: false`
        // (validation refuses it together with `privileged` or CAP_SYS_ADMIN).
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp,
    }
}

fn seccomp_profile(profile: &ApiSeccomp, dir: &std::path::Path) -> SeccompProfile {
    match profile.type_.as_str() {
        "RuntimeDefault" => SeccompProfile::RuntimeDefault,
        "Localhost" => match profile.localhost_profile.as_deref() {
            // Relative to the seccomp directory, never outside it (validation refuses "..").
            Some(rel) if !rel.split('/').any(|c| c == "..") => {
                SeccompProfile::Localhost(dir.join(rel.trim_start_matches('/')))
            }
            _ => SeccompProfile::RuntimeDefault,
        },
        _ => SeccompProfile::Unconfined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fs_group_is_the_first_supplemental_group() {
        use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec};
        let pod = Pod {
            spec: Some(PodSpec {
                security_context: Some(PodSecurityContext {
                    fs_group: Some(1001),
                    supplemental_groups: Some(vec![5, 6]),
                    ..PodSecurityContext::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let config = security_config(
            &pod,
            &Container::default(),
            false,
            std::path::Path::new("/"),
        );
        assert_eq!(config.supplemental_groups, vec![1001, 5, 6]);
    }

    #[test]
    fn no_new_privs_only_for_allow_privilege_escalation_false() {
        use k8s_openapi::api::core::v1::SecurityContext;
        let nnp = |allow: Option<bool>, privileged: Option<bool>| {
            let container = Container {
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: allow,
                    privileged,
                    ..SecurityContext::default()
                }),
                ..Container::default()
            };
            security_config(
                &Pod::default(),
                &container,
                false,
                std::path::Path::new("/"),
            )
            .no_new_privs
        };
        assert!(nnp(Some(false), None));
        assert!(!nnp(None, None), "unset means escalation is allowed");
        assert!(!nnp(Some(true), None));
        assert!(!nnp(None, Some(true)));
        let bare = security_config(
            &Pod::default(),
            &Container::default(),
            false,
            std::path::Path::new("/"),
        );
        assert!(!bare.no_new_privs, "no security context at all");
    }

    #[test]
    fn pod_sysctls_are_handed_to_the_runtime_dot_separated() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "securityContext": {"sysctls": [
                {"name": "kernel.shm_rmid_forced", "value": "1"},
                {"name": "net/ipv4/ip_unprivileged_port_start", "value": "80"},
            ]}}
        }))
        .expect("pod");
        assert_eq!(
            pod_sysctls(&pod),
            BTreeMap::from([
                ("kernel.shm_rmid_forced".to_owned(), "1".to_owned()),
                (
                    "net.ipv4.ip_unprivileged_port_start".to_owned(),
                    "80".to_owned()
                ),
            ])
        );
        assert!(pod_sysctls(&Pod::default()).is_empty());
    }

    #[test]
    fn oom_score_adj_follows_kubelet_policy() {
        assert_eq!(oom_score_adj(QosClass::Guaranteed, 0, 100), -997);
        assert_eq!(oom_score_adj(QosClass::BestEffort, 0, 100), 1000);
        assert_eq!(oom_score_adj(QosClass::Burstable, 50, 100), 500);
        assert_eq!(oom_score_adj(QosClass::Burstable, 100, 100), 2);
        assert_eq!(oom_score_adj(QosClass::Burstable, 0, 100), 999);
    }

    #[test]
    fn a_localhost_profile_cannot_name_a_file_outside_the_seccomp_dir() {
        let dir = std::path::Path::new("/var/lib/ironlet/seccomp");
        let escape = ApiSeccomp {
            type_: "Localhost".into(),
            localhost_profile: Some("../../etc/shadow".into()),
        };
        assert_eq!(
            seccomp_profile(&escape, dir),
            SeccompProfile::RuntimeDefault
        );
        let ok = ApiSeccomp {
            type_: "Localhost".into(),
            localhost_profile: Some("profiles/a.json".into()),
        };
        assert_eq!(
            seccomp_profile(&ok, dir),
            SeccompProfile::Localhost(dir.join("profiles/a.json"))
        );
    }
}

//! Security-context checks made before a container is created (kubelet's
//! `verifyRunAsNonRoot`): a container whose effective `runAsNonRoot` is true must not run
//! as UID 0, by its `runAsUser` or by its image's `USER`.
//!
//! The effective values are the container's, else the pod's. An image without a `USER`
//! runs as root; a `USER` given by name cannot be checked and is refused too. A refusal is
//! a `CreateContainerConfigError` whose message is kubelet's, word for word (the `Failed`
//! event says `Error: <message>`).

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::pod_desc;

/// The user an image's config runs as (`USER uid[:gid]` or `USER name[:group]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageUser {
    Uid(i64),
    Name(String),
}

impl ImageUser {
    /// The image config's `User`; none or empty is root, as kubelet's `getImageUser`.
    #[must_use]
    pub fn parse(user: Option<&str>) -> Self {
        let user = user.unwrap_or_default();
        let name = user.split(':').next().unwrap_or_default();
        if name.is_empty() {
            return Self::Uid(0);
        }
        match name.parse() {
            Ok(uid) => Self::Uid(uid),
            Err(_) => Self::Name(name.to_owned()),
        }
    }
}

/// kubelet's `verifyRunAsNonRoot`: `Err` with kubelet's message when the container would
/// break its `runAsNonRoot` policy.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
) -> Result<(), String> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| pod_sc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if !non_root {
        return Ok(());
    }
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let (pod, name) = (pod_desc(pod), &container.name);
    match (run_as_user, image_user) {
        (Some(0), _) => Err(format!(
            "container's runAsUser breaks non-root policy (pod: {pod:?}, container: {name})"
        )),
        (Some(_), _) => Ok(()),
        (None, ImageUser::Uid(0)) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {name})"
        )),
        (None, ImageUser::Uid(_)) => Ok(()),
        (None, ImageUser::Name(user)) => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify \
             user is non-root (pod: {pod:?}, container: {name})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, SecurityContext};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(non_root: Option<bool>, user: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                security_context: Some(PodSecurityContext {
                    run_as_non_root: non_root,
                    run_as_user: user,
                    ..PodSecurityContext::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn container(non_root: Option<bool>, user: Option<i64>) -> Container {
        Container {
            name: "c".into(),
            security_context: Some(SecurityContext {
                run_as_non_root: non_root,
                run_as_user: user,
                ..SecurityContext::default()
            }),
            ..Container::default()
        }
    }

    #[test]
    fn image_users_parse_as_kubelet_reads_them() {
        assert_eq!(ImageUser::parse(None), ImageUser::Uid(0));
        assert_eq!(ImageUser::parse(Some("")), ImageUser::Uid(0));
        assert_eq!(ImageUser::parse(Some("1000:1000")), ImageUser::Uid(1000));
        assert_eq!(
            ImageUser::parse(Some("nobody:nogroup")),
            ImageUser::Name("nobody".into())
        );
    }

    #[test]
    fn an_image_running_as_root_is_refused_with_kubelets_message() {
        let err = verify_run_as_non_root(
            &pod(Some(true), None),
            &container(None, None),
            &ImageUser::parse(None),
        );
        assert_eq!(
            err,
            Err("container has runAsNonRoot and image will run as root \
                 (pod: \"p_ns(u1)\", container: c)"
                .into())
        );
    }

    #[test]
    fn an_explicit_root_user_is_refused_and_a_non_root_one_allowed() {
        let image = ImageUser::Uid(0);
        assert_eq!(
            verify_run_as_non_root(
                &pod(None, Some(1000)),
                &container(Some(true), Some(0)),
                &image
            ),
            Err(
                "container's runAsUser breaks non-root policy (pod: \"p_ns(u1)\", container: c)"
                    .into()
            )
        );
        assert_eq!(
            verify_run_as_non_root(
                &pod(Some(true), Some(0)),
                &container(None, Some(1234)),
                &image
            ),
            Ok(())
        );
    }

    #[test]
    fn a_named_image_user_cannot_be_verified_and_a_numeric_one_can() {
        let named = verify_run_as_non_root(
            &pod(Some(true), None),
            &container(None, None),
            &ImageUser::Name("nobody".into()),
        );
        assert!(
            matches!(&named, Err(m) if m.contains("non-numeric user (nobody)")),
            "{named:?}"
        );
        assert_eq!(
            verify_run_as_non_root(
                &pod(Some(true), None),
                &container(None, None),
                &ImageUser::Uid(65534)
            ),
            Ok(())
        );
    }

    #[test]
    fn the_container_setting_overrides_the_pod_one() {
        assert_eq!(
            verify_run_as_non_root(
                &pod(Some(true), None),
                &container(Some(false), None),
                &ImageUser::Uid(0)
            ),
            Ok(())
        );
    }
}

//! Pod helpers shared by the end-to-end tests: [`create_pod`] (retrying while the
//! namespace's default ServiceAccount does not exist yet) and [`pod_condition`].

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::eventually;

/// Creates `pod`, retrying for up to 30 s while the namespace's default ServiceAccount does
/// not exist yet (the ServiceAccount admission plugin rejects pods until the controller
/// manager made it).
pub async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), pod).await?;
        Ok(Some(()))
    })
    .await
}

/// The status (`True`, `False`, `Unknown`) of the pod's condition of type `type_`.
pub fn pod_condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
        .map(|c| c.status.clone())
}

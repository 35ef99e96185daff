//! Image pulls end to end: a real `ironlet run --kubeconfig` joined to a real control plane
//! pulls from a real registry (Debian's docker-registry on loopback, TLS from a test CA
//! given with `--registry-config`, htpasswd auth) filled by skopeo. A pod whose image is
//! only in the registry runs with the credentials of a `kubectl create secret
//! docker-registry` secret, with `Pulling`/`Pulled` events; a secret with a wrong password
//! leaves the container in `ErrImagePull`/`ImagePullBackOff` with the registry's error.
//!
//! One control plane, one registry and one agent (node `e2e-pull-<pid>`) serve every test
//! of this binary. Needs root (containers, cgroups, CNI).

use std::time::Duration;

use anyhow::Result;
use ironlet_e2e::{
    block_on, eventually, images_out, run_suite, ClusterAgent, ControlPlane, SuiteTest,
};
use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const USER: &str = "e2e-puller";
const PASS: &str = "e2e-right-password";

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
    registry: TestRegistry,
    _work: tempfile::TempDir,
}

const TESTS: &[SuiteTest<Env>] = &[
    (
        "a_pod_whose_image_is_only_in_the_registry_runs_with_its_docker_registry_secret",
        pulls_with_secret,
    ),
    (
        "a_wrong_password_leaves_the_container_in_image_pull_back_off_with_the_registrys_error",
        wrong_password_backs_off,
    ),
];

fn main() {
    run_suite("cluster_pull", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
    })
}

fn start() -> Result<Env> {
    let registry = TestRegistry::start(RegistryOptions {
        basic_auth: Some((USER.into(), PASS.into())),
    })?;
    // layered: three of its four layers are nowhere on the node (the agent imports busybox).
    registry.push(&images_out()?.join("layered"), "pulled/layered:1", &[])?;
    let work = tempfile::tempdir()?;
    let config = work.path().join("registries.yaml");
    std::fs::write(
        &config,
        format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            registry.host(),
            registry.ca_file().display()
        ),
    )?;
    let plane = ControlPlane::up()?;
    let node = format!("e2e-pull-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start_with_args(
        &kubeconfig,
        &node,
        (std::process::id() + 97) % 250,
        &["--registry-config".as_ref(), config.as_os_str()],
    )?;
    Ok(Env {
        plane,
        agent,
        registry,
        _work: work,
    })
}

/// A pod of the registry's image with pull secret `secret`; `Always` pulls even when the
/// image is present (so a wrong password is always checked).
fn registry_pod(env: &Env, name: &str, secret: &str, policy: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "terminationGracePeriodSeconds": 1,
            "imagePullSecrets": [{ "name": secret }],
            "containers": [{
                "name": "main",
                "image": format!("{}/pulled/layered:1", env.registry.host()),
                "imagePullPolicy": policy,
                "command": ["sleep", "3603"],
            }],
        },
    }))?)
}

fn docker_registry_secret(env: &Env, name: &str, password: &str) -> Result<()> {
    let _ = env
        .plane
        .kubectl(&["delete", "secret", name, "--ignore-not-found"]);
    env.plane
        .kubectl(&[
            "create",
            "secret",
            "docker-registry",
            name,
            &format!("--docker-server={}", env.registry.host()),
            &format!("--docker-username={USER}"),
            &format!("--docker-password={password}"),
        ])
        .map(drop)
}

async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Result<()> {
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), pod).await?;
        Ok(Some(()))
    })
    .await
}

async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    pods.delete(name, &DeleteParams::default()).await?;
    eventually(
        &format!("pod {name} gone"),
        Duration::from_secs(60),
        || async { Ok(pods.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

async fn event_messages(env: &Env, pod: &str) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(env.plane.admin_client().await?, "default");
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

fn pulls_with_secret(env: &Env) -> Result<()> {
    block_on(async {
        docker_registry_secret(env, "regcred", PASS)?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        create_pod(
            &pods,
            &registry_pod(env, "pulled", "regcred", "IfNotPresent")?,
        )
        .await?;
        let result = eventually("pulled Running", Duration::from_secs(90), || async {
            let pod = pods.get("pulled").await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            Ok((phase.as_deref() == Some("Running")).then_some(pod))
        })
        .await;
        let events = event_messages(env, "pulled").await?;
        let cleanup = delete_pod(&pods, "pulled").await;
        let pod = result?;
        cleanup?;
        let image_id = pod
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .map(|c| c.image_id)
            .unwrap_or_default();
        anyhow::ensure!(
            image_id.contains("pulled/layered@sha256:"),
            "imageID {image_id:?}"
        );
        let image = format!("{}/pulled/layered:1", env.registry.host());
        anyhow::ensure!(
            events
                .iter()
                .any(|(r, m)| r == "Pulling" && m == &format!("Pulling image \"{image}\"")),
            "no Pulling event: {events:?}"
        );
        anyhow::ensure!(
            events.iter().any(|(r, m)| r == "Pulled"
                && m.starts_with(&format!("Successfully pulled image \"{image}\" in "))
                && m.contains("s including waiting). Image size: ")),
            "no Pulled event: {events:?}"
        );
        Ok(())
    })
}

fn wrong_password_backs_off(env: &Env) -> Result<()> {
    block_on(async {
        docker_registry_secret(env, "badcred", "wrong-password")?;
        let pods: Api<Pod> = Api::namespaced(env.plane.admin_client().await?, "default");
        create_pod(&pods, &registry_pod(env, "badpull", "badcred", "Always")?).await?;
        let waiting = |reason: &'static str| {
            let pods = pods.clone();
            async move {
                eventually(
                    &format!("badpull waiting in {reason}"),
                    Duration::from_secs(60),
                    || async {
                        let pod = pods.get("badpull").await?;
                        let w = pod
                            .status
                            .and_then(|s| s.container_statuses)
                            .and_then(|c| c.into_iter().next())
                            .and_then(|c| c.state)
                            .and_then(|s| s.waiting);
                        Ok(w.filter(|w| w.reason.as_deref() == Some(reason))
                            .map(|w| w.message.unwrap_or_default()))
                    },
                )
                .await
            }
        };
        let pull_err = waiting("ErrImagePull").await;
        let back_off = waiting("ImagePullBackOff").await;
        let events = event_messages(env, "badpull").await?;
        let cleanup = delete_pod(&pods, "badpull").await;
        let (pull_err, back_off) = (pull_err?, back_off?);
        cleanup?;
        for message in [&pull_err, &back_off] {
            anyhow::ensure!(
                message.contains("authorization failed") && message.contains(&env.registry.host()),
                "waiting message without the registry's error: {message:?}"
            );
        }
        anyhow::ensure!(
            back_off.starts_with("Back-off pulling image"),
            "{back_off:?}"
        );
        anyhow::ensure!(
            events
                .iter()
                .any(|(r, m)| r == "Failed" && m.starts_with("Failed to pull image")),
            "no Failed event: {events:?}"
        );
        anyhow::ensure!(
            events.iter().any(|(r, _)| r == "BackOff"),
            "no BackOff event: {events:?}"
        );
        Ok(())
    })
}

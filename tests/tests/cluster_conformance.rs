//! Node conformance behaviours that need the API, end to end: a real `ironlet run
//! --kubeconfig` joined to a real control plane (`scripts/controlplane`).
//!
//! * Service link variables: a container sees `<SVC>_SERVICE_HOST`… of its namespace's
//!   Services (created after the agent started: the agent's Service watch), never of a
//!   headless one, always of `default/kubernetes` (also with `enableServiceLinks: false`),
//!   and explicit `env` wins ("Pods should contain environment variables for services").
//! * Pod readiness gates: `Ready` follows the gate conditions a client patches through the
//!   status subresource, and the agent's status writes keep them ("Pods should support pod
//!   readiness gates").
//! * While a pod terminates, its readiness probe goes on and turns it not Ready during the
//!   grace period, and its liveness probe stops (no restart, no liveness event), for a
//!   regular container and for a sidecar ("Probing container should mark readiness on pods
//!   to false … while pod is in progress of terminating").
//!
//! One control plane and one agent (node `e2e-conf-<pid>`) serve every test of this binary;
//! the tests use distinct pod names. Needs root (containers, cgroups, CNI).

use std::time::Duration;

use anyhow::{Context, Result};
use ironlet_e2e::{
    block_on, create_pod as create, eventually, pod_condition as condition, run_suite,
    ClusterAgent, ControlPlane, SuiteTest,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
}

const TESTS: &[SuiteTest<Env>] = &[
    (
        "containers_get_service_link_variables_of_their_namespace_and_of_the_kubernetes_service",
        service_links,
    ),
    (
        "ready_follows_readiness_gate_conditions_patched_by_a_client_and_they_are_kept",
        readiness_gates,
    ),
    (
        "a_terminating_pod_turns_not_ready_by_its_readiness_probe_and_its_liveness_probe_stops",
        terminating_readiness,
    ),
    (
        "a_terminating_pod_turns_not_ready_by_its_sidecars_readiness_probe",
        terminating_sidecar_readiness,
    ),
];

fn main() {
    run_suite("cluster_conformance", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(80));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    })
}

fn start() -> Result<Env> {
    let plane = ControlPlane::up()?;
    let node = format!("e2e-conf-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start(&kubeconfig, &node, (std::process::id() + 173) % 250)?;
    Ok(Env { plane, agent })
}

async fn admin(env: &Env) -> Result<Client> {
    env.plane.admin_client().await
}

/// Waits until `check` holds for the pod, returning it.
async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    eventually(&format!("pod {name}: {what}"), timeout, || async {
        let pod = pods.get(name).await?;
        Ok(check(&pod).then_some(pod))
    })
    .await
}

async fn delete_and_wait(pods: &Api<Pod>, name: &str, grace: u32) -> Result<()> {
    pods.delete(name, &DeleteParams::default().grace_period(grace))
        .await?;
    eventually(
        &format!("pod {name} gone"),
        Duration::from_secs(60),
        || async { Ok(pods.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

fn cluster_ip(service: &Service) -> Result<String> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .context("the service has a cluster IP")
}

/// The container's termination message: what `env` printed into it.
fn env_lines(pod: &Pod) -> Vec<String> {
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .unwrap_or_default();
    message.lines().map(str::to_owned).collect()
}

fn env_pod(name: &str, node: &str, links: bool, env: serde_json::Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "enableServiceLinks": links,
            "containers": [{
                "name": "env",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c",
                    "env | grep -E '^(FOOSERVICE|HEADLESS|KUBERNETES)' | sort > /dev/termination-log"],
                "env": env,
            }],
        },
    }))?)
}

fn service_links(env: &Env) -> Result<()> {
    block_on(async {
        let client = admin(env).await?;
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let fooservice: Service = serde_json::from_value(json!({
            "metadata": { "name": "fooservice" },
            "spec": {
                "selector": { "app": "nothing" },
                "ports": [
                    { "name": "http", "port": 8765, "targetPort": 8080 },
                    { "name": "dns", "port": 53, "protocol": "UDP" },
                ],
            },
        }))?;
        let headless: Service = serde_json::from_value(json!({
            "metadata": { "name": "headless" },
            "spec": { "clusterIP": "None", "ports": [{ "port": 80 }] },
        }))?;
        let fooservice = services.create(&PostParams::default(), &fooservice).await?;
        services.create(&PostParams::default(), &headless).await?;
        let ip = cluster_ip(&fooservice)?;
        let kubernetes_ip = cluster_ip(&services.get("kubernetes").await?)?;
        // The agent's watch delivers new Services within milliseconds.
        tokio::time::sleep(Duration::from_secs(1)).await;

        let node = &env.agent.node_name;
        let linked = env_pod("svcenv-linked", node, true, json!([]))?;
        let unlinked = env_pod(
            "svcenv-unlinked",
            node,
            false,
            json!([{ "name": "FOOSERVICE_SERVICE_HOST", "value": "explicit" }]),
        )?;
        create(&pods, &linked).await?;
        create(&pods, &unlinked).await?;
        let done =
            |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
        let timeout = Duration::from_secs(60);
        let linked = wait_pod(&pods, "svcenv-linked", "Succeeded", timeout, done).await?;
        let unlinked = wait_pod(&pods, "svcenv-unlinked", "Succeeded", timeout, done).await?;

        let lines = env_lines(&linked);
        for want in [
            format!("FOOSERVICE_SERVICE_HOST={ip}"),
            "FOOSERVICE_SERVICE_PORT=8765".to_owned(),
            "FOOSERVICE_SERVICE_PORT_HTTP=8765".to_owned(),
            "FOOSERVICE_SERVICE_PORT_DNS=53".to_owned(),
            format!("FOOSERVICE_PORT=tcp://{ip}:8765"),
            format!("FOOSERVICE_PORT_8765_TCP=tcp://{ip}:8765"),
            "FOOSERVICE_PORT_8765_TCP_PROTO=tcp".to_owned(),
            "FOOSERVICE_PORT_8765_TCP_PORT=8765".to_owned(),
            format!("FOOSERVICE_PORT_8765_TCP_ADDR={ip}"),
            format!("FOOSERVICE_PORT_53_UDP=udp://{ip}:53"),
            "FOOSERVICE_PORT_53_UDP_PROTO=udp".to_owned(),
            format!("KUBERNETES_SERVICE_HOST={kubernetes_ip}"),
            "KUBERNETES_SERVICE_PORT_HTTPS=443".to_owned(),
            format!("KUBERNETES_PORT=tcp://{kubernetes_ip}:443"),
        ] {
            anyhow::ensure!(lines.contains(&want), "no {want} in {lines:?}");
        }
        anyhow::ensure!(
            !lines.iter().any(|l| l.starts_with("HEADLESS")),
            "a headless service is linked: {lines:?}"
        );

        let lines = env_lines(&unlinked);
        anyhow::ensure!(
            lines.contains(&"FOOSERVICE_SERVICE_HOST=explicit".to_owned())
                && lines.len() > 1
                && lines.iter().all(
                    |l| l.starts_with("KUBERNETES_") || l == "FOOSERVICE_SERVICE_HOST=explicit"
                ),
            "enableServiceLinks: false links the kubernetes service only: {lines:?}"
        );
        anyhow::ensure!(
            lines.contains(&format!("KUBERNETES_SERVICE_HOST={kubernetes_ip}")),
            "{lines:?}"
        );

        delete_and_wait(&pods, "svcenv-linked", 0).await?;
        delete_and_wait(&pods, "svcenv-unlinked", 0).await?;
        services
            .delete("fooservice", &DeleteParams::default())
            .await?;
        services
            .delete("headless", &DeleteParams::default())
            .await?;
        Ok(())
    })
}

const GATE_1: &str = "k8s.io/test-condition1";
const GATE_2: &str = "k8s.io/test-condition2";

/// Sets gate `type_` to `status` as the e2e test does: a strategic merge patch of the
/// status subresource.
async fn set_gate(pods: &Api<Pod>, name: &str, type_: &str, status: &str) -> Result<()> {
    let patch = json!({ "status": { "conditions": [{ "type": type_, "status": status }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

fn readiness_gates(env: &Env) -> Result<()> {
    const NAME: &str = "svcenv-gates";
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": NAME, "namespace": "default" },
            "spec": {
                "nodeName": env.agent.node_name,
                "terminationGracePeriodSeconds": 1,
                "readinessGates": [
                    { "conditionType": GATE_1 },
                    { "conditionType": GATE_2 },
                ],
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3701"],
                }],
            },
        }))?;
        create(&pods, &pod).await?;
        let short = Duration::from_secs(20);
        let running = wait_pod(
            &pods,
            NAME,
            "ContainersReady",
            Duration::from_secs(60),
            |p| condition(p, "ContainersReady").as_deref() == Some("True"),
        )
        .await?;
        let ready = condition(&running, "Ready");
        anyhow::ensure!(
            ready.as_deref() == Some("False"),
            "Ready {ready:?} without gates"
        );

        set_gate(&pods, NAME, GATE_1, "True").await?;
        // A status write of the agent (it reconciles on the change) must keep the gate.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pod = pods.get(NAME).await?;
        anyhow::ensure!(
            condition(&pod, GATE_1).as_deref() == Some("True")
                && condition(&pod, "Ready").as_deref() == Some("False"),
            "one gate True: {:?}",
            pod.status.and_then(|s| s.conditions)
        );

        set_gate(&pods, NAME, GATE_2, "True").await?;
        wait_pod(&pods, NAME, "Ready with both gates True", short, |p| {
            condition(p, "Ready").as_deref() == Some("True")
        })
        .await?;

        set_gate(&pods, NAME, GATE_1, "False").await?;
        let pod = wait_pod(&pods, NAME, "not Ready again", short, |p| {
            condition(p, "Ready").as_deref() == Some("False")
        })
        .await?;
        anyhow::ensure!(
            condition(&pod, GATE_1).as_deref() == Some("False")
                && condition(&pod, GATE_2).as_deref() == Some("True"),
            "gates {:?}",
            pod.status.and_then(|s| s.conditions)
        );
        delete_and_wait(&pods, NAME, 1).await
    })
}

/// A script that, on SIGTERM, removes its readiness and liveness files and takes 30 s more.
const SLOW_TERM: &str = "trap 'rm -f /tmp/ready /tmp/live; sleep 30; exit 0' TERM; \
     touch /tmp/ready /tmp/live; while true; do sleep 1; done";

fn probes() -> serde_json::Value {
    json!({
        "readinessProbe": {
            "exec": { "command": ["cat", "/tmp/ready"] },
            "periodSeconds": 1, "failureThreshold": 1,
        },
        "livenessProbe": {
            "exec": { "command": ["cat", "/tmp/live"] },
            "periodSeconds": 1, "failureThreshold": 1,
        },
    })
}

fn container(name: &str, script: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut container = json!({
        "name": name,
        "image": "busybox",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    });
    if let (Some(c), Some(extra)) = (container.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    container
}

fn all_statuses(pod: &Pod) -> Vec<ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .cloned()
        .collect()
}

/// Deletes the Ready pod `name` (grace 30 s) and checks that it turns not Ready while its
/// container `slow` still runs, with no liveness failure or restart; then forces it away.
async fn not_ready_while_terminating(
    pods: &Api<Pod>,
    events: &Api<Event>,
    name: &str,
) -> Result<()> {
    wait_pod(pods, name, "Ready", Duration::from_secs(60), |p| {
        condition(p, "Ready").as_deref() == Some("True")
    })
    .await?;
    pods.delete(name, &DeleteParams::default().grace_period(30))
        .await?;
    let what = "not Ready, its slow container running but not ready, while terminating";
    wait_pod(pods, name, what, Duration::from_secs(15), |p| {
        let slow = all_statuses(p).into_iter().find(|c| c.name == "slow");
        condition(p, "Ready").as_deref() == Some("False")
            && slow
                .is_some_and(|c| !c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
    })
    .await?;
    // Its liveness file is gone too: a liveness probe still running would fail now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let pod = pods.get(name).await?;
    let restarts: i32 = all_statuses(&pod).iter().map(|c| c.restart_count).sum();
    anyhow::ensure!(restarts == 0, "{restarts} restarts while terminating");
    let fields = format!("involvedObject.name={name}");
    let liveness: Vec<String> = events
        .list(&ListParams::default().fields(&fields))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .filter(|m| m.contains("Liveness probe failed") || m.contains("failed liveness probe"))
        .collect();
    anyhow::ensure!(liveness.is_empty(), "liveness events: {liveness:?}");
    delete_and_wait(pods, name, 0).await
}

fn terminating_readiness(env: &Env) -> Result<()> {
    let containers = json!({ "containers": [container("slow", SLOW_TERM, probes())] });
    terminating_pod(env, "svcenv-term", containers)
}

fn terminating_sidecar_readiness(env: &Env) -> Result<()> {
    let mut sidecar = probes();
    if let Some(fields) = sidecar.as_object_mut() {
        fields.insert("restartPolicy".into(), json!("Always"));
    }
    let main = "trap 'exit 0' TERM; while true; do sleep 1; done";
    let containers = json!({
        "initContainers": [container("slow", SLOW_TERM, sidecar)],
        "containers": [container("main", main, json!({}))],
    });
    terminating_pod(env, "svcenv-term-sidecar", containers)
}

/// Runs pod `name` with these containers (one of them `slow`) and a 30 s grace period,
/// then [`not_ready_while_terminating`].
fn terminating_pod(env: &Env, name: &str, containers: serde_json::Value) -> Result<()> {
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client, "default");
        let mut spec = json!({
            "nodeName": env.agent.node_name,
            "terminationGracePeriodSeconds": 30,
        });
        if let (Some(spec), Some(containers)) = (spec.as_object_mut(), containers.as_object()) {
            spec.extend(containers.clone());
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "default" },
            "spec": spec,
        }))?;
        create(&pods, &pod).await?;
        not_ready_while_terminating(&pods, &events, name).await
    })
}

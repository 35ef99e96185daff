//! A real `ironlet run --kubeconfig` joined to a real control plane (`scripts/controlplane`):
//! the node turns Ready; pods created through the API (bound by `spec.nodeName` or by the
//! real kube-scheduler) run with correct statuses, stop on a
//! graceful or forced delete and disappear; a failing container under `restartPolicy: Never`
//! ends Failed with its exit code; static pods get mirror pods (recreated when deleted,
//! deleted with the manifest); a pod waiting for a missing ConfigMap gets an event and starts
//! once it exists; pods keep running through a 60 s apiserver outage (SIGSTOP) and status
//! converges within 10 s after it; a pod filling its emptyDir beyond `sizeLimit` is evicted;
//! a non-root container writes its termination message at a custom path; a running pod whose
//! `activeDeadlineSeconds` is shortened ends `DeadlineExceeded`; the status and the
//! kubelet's conditions observe each new generation of a pod. ConfigMaps and Secrets are
//! watched (issue 17): a pod waiting for a missing ConfigMap runs within 4 s of its creation
//! (the failed-sync back-off alone is 10 s); an update of a mounted ConfigMap and Secret is
//! seen in the container within 10 s (kubelet's bound is its 60 s sync period); deleting the
//! pod stops both watches.
//!
//! One control plane and one agent (node `e2e-cluster-<pid>`) serve every test of this
//! binary; the tests use distinct pod names. Needs root (containers, cgroups, CNI).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ironlet_e2e::{
    block_on, create_pod as create, eventually, is_selected, ClusterAgent, ControlPlane,
};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
    /// The outage test holds it exclusively: the others' timeouts assume a live apiserver.
    api_up: std::sync::RwLock<()>,
}

type TestFn = fn(&Env) -> Result<()>;

const TESTS: &[(&str, TestFn)] = &[
    ("the_node_turns_ready", node_turns_ready),
    (
        "a_pod_runs_with_correct_statuses_and_a_graceful_delete_removes_it",
        pod_runs_then_graceful_delete,
    ),
    (
        "a_force_deleted_pod_is_gone_and_its_container_stops",
        force_delete,
    ),
    (
        "a_container_exiting_non_zero_under_restart_never_ends_failed_with_its_exit_code",
        failed_pod_reports_exit_code,
    ),
    (
        "a_static_pod_gets_a_mirror_pod_that_is_recreated_and_removed_with_the_manifest",
        static_pod_mirror,
    ),
    (
        "a_pod_waiting_for_a_missing_config_map_gets_an_event_and_starts_once_it_exists",
        missing_config_map,
    ),
    (
        "a_pod_waiting_for_a_missing_config_map_runs_within_4_s_of_its_creation_through_a_watch",
        config_map_watch_starts_waiting_pod,
    ),
    (
        "mounted_config_map_and_secret_updates_reach_the_container_and_deleting_the_pod_stops_the_watches",
        live_volume_updates,
    ),
    (
        "a_pod_scheduled_by_the_kube_scheduler_runs_on_the_node",
        scheduled_pod_runs,
    ),
    (
        "a_pod_gets_a_service_account_token_bound_to_it_that_the_api_server_accepts",
        service_account_token,
    ),
    (OUTAGE_TEST, apiserver_outage),
    (
        "a_pod_with_a_69_character_name_runs_with_its_hostname_truncated_to_63",
        long_named_pod,
    ),
    (
        "a_pod_filling_its_empty_dir_beyond_its_size_limit_is_evicted",
        empty_dir_eviction,
    ),
    (
        "a_failing_readiness_probe_gets_a_warning_unhealthy_event_with_its_output",
        readiness_unhealthy_event,
    ),
    (
        "a_non_root_container_writes_its_termination_message_at_a_custom_path",
        non_root_termination_message,
    ),
    (
        "a_running_pod_whose_active_deadline_is_shortened_ends_deadline_exceeded",
        active_deadline_shortened,
    ),
    (
        "the_status_and_the_kubelets_conditions_observe_each_new_generation_of_the_pod",
        observed_generation,
    ),
];

const OUTAGE_TEST: &str =
    "pods_keep_running_through_a_60_s_apiserver_outage_and_status_converges_within_10_s_after";

const RUNNING_TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    let args = Arguments::from_args();
    let selected = TESTS.iter().any(|(name, _)| is_selected(&args, name));
    if args.list || !selected || !nix::unistd::geteuid().is_root() {
        let trials = TESTS
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())).with_ignored_flag(!args.list))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let env = match start() {
        Ok(env) => Arc::new(env),
        Err(err) => {
            eprintln!("cluster_pods: cannot start: {err:#}");
            std::process::exit(1);
        }
    };
    let trials = TESTS
        .iter()
        .map(|&(name, test)| {
            let env = Arc::clone(&env);
            Trial::test(name, move || {
                let outage = name == OUTAGE_TEST;
                let _shared = (!outage).then(|| env.api_up.read());
                let _exclusive = outage.then(|| env.api_up.write());
                test(&env).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if conclusion.has_failed() {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    }
    drop(env);
    conclusion.exit();
}

fn start() -> Result<Env> {
    let plane = ControlPlane::up()?;
    let node = format!("e2e-cluster-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let agent = ClusterAgent::start(&kubeconfig, &node, std::process::id() % 250)?;
    Ok(Env {
        plane,
        agent,
        api_up: std::sync::RwLock::new(()),
    })
}

async fn admin(env: &Env) -> Result<Client> {
    env.plane.admin_client().await
}

fn busybox_pod(name: &str, node: &str, command: &[&str], restart: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": command,
            }],
        },
    }))?)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

async fn wait_phase(pods: &Api<Pod>, name: &str, want: &str) -> Result<Pod> {
    eventually(
        &format!("pod {name} phase {want}"),
        RUNNING_TIMEOUT,
        || async {
            let pod = pods.get(name).await?;
            Ok((phase(&pod) == want).then_some(pod))
        },
    )
    .await
}

async fn wait_gone(pods: &Api<Pod>, name: &str, timeout: Duration) -> Result<()> {
    eventually(&format!("pod {name} gone"), timeout, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// The first event about the object `name` that `matches`, waited for up to 30 s.
async fn event_about(
    events: &Api<Event>,
    name: &str,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Result<Event> {
    let fields = format!("involvedObject.name={name}");
    eventually(what, Duration::from_secs(30), || async {
        let list = events.list(&ListParams::default().fields(&fields)).await?;
        Ok(list.items.into_iter().find(|e| matches(e)))
    })
    .await
}

/// `pod` (phase Failed) has `reason` and `message` in its status, and an event of
/// `event_type` with that reason and message was recorded about it.
async fn ensure_failed_by_node(
    pod: &Pod,
    events: &Api<Event>,
    reason: &str,
    event_type: &str,
    message: &str,
) -> Result<()> {
    let status = pod.status.clone().unwrap_or_default();
    anyhow::ensure!(
        status.reason.as_deref() == Some(reason) && status.message.as_deref() == Some(message),
        "reason {:?}, message {:?}",
        status.reason,
        status.message
    );
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let event = event_about(events, name, &format!("the {reason} event"), |e| {
        e.reason.as_deref() == Some(reason)
    })
    .await?;
    anyhow::ensure!(
        event.type_.as_deref() == Some(event_type) && event.message.as_deref() == Some(message),
        "event {:?}: {:?}",
        event.type_,
        event.message
    );
    Ok(())
}

/// Whether a process whose command line contains `needle` exists.
fn process_running(needle: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
            .unwrap_or(false)
    })
}

fn node_turns_ready(env: &Env) -> Result<()> {
    block_on(async {
        let nodes: Api<Node> = Api::all(admin(env).await?);
        eventually("node Ready", Duration::from_secs(30), || async {
            let Some(node) = nodes.get_opt(&env.agent.node_name).await? else {
                return Ok(None);
            };
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            Ok(ready.then_some(()))
        })
        .await
    })
}

fn pod_runs_then_graceful_delete(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let pod = busybox_pod(
            "graceful",
            &env.agent.node_name,
            &["sleep", "3602"],
            "Always",
        )?;
        create(&pods, &pod).await?;
        let running = eventually("graceful Running and ready", RUNNING_TIMEOUT, || async {
            let pod = pods.get("graceful").await?;
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .is_some_and(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
            Ok((phase(&pod) == "Running" && ready).then_some(pod))
        })
        .await?;
        let status = running.status.unwrap_or_default();
        let container = &status.container_statuses.unwrap_or_default()[0];
        anyhow::ensure!(
            container.name == "main",
            "container name {}",
            container.name
        );
        anyhow::ensure!(
            container.restart_count == 0,
            "restarts {}",
            container.restart_count
        );
        anyhow::ensure!(container.container_id.is_some(), "no containerID");
        anyhow::ensure!(status.pod_ip.is_some(), "no podIP");
        anyhow::ensure!(status.host_ip.is_some(), "no hostIP");
        anyhow::ensure!(status.start_time.is_some(), "no startTime");
        anyhow::ensure!(
            status.qos_class.as_deref() == Some("BestEffort"),
            "qosClass {:?}",
            status.qos_class
        );
        anyhow::ensure!(process_running("sleep 3602"), "container process not found");

        let params = DeleteParams {
            grace_period_seconds: Some(3),
            ..DeleteParams::default()
        };
        pods.delete("graceful", &params).await?;
        // sleep as PID 1 ignores SIGTERM: the 3 s grace runs out, then SIGKILL.
        wait_gone(&pods, "graceful", Duration::from_secs(30)).await?;
        anyhow::ensure!(
            !process_running("sleep 3602"),
            "container still running after delete"
        );
        Ok(())
    })
}

fn force_delete(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let pod = busybox_pod("forced", &env.agent.node_name, &["sleep", "3603"], "Always")?;
        create(&pods, &pod).await?;
        wait_phase(&pods, "forced", "Running").await?;
        pods.delete("forced", &DeleteParams::default().grace_period(0))
            .await?;
        wait_gone(&pods, "forced", Duration::from_secs(5)).await?;
        eventually(
            "the forced pod's container stops",
            Duration::from_secs(40),
            || async { Ok((!process_running("sleep 3603")).then_some(())) },
        )
        .await
    })
}

fn failed_pod_reports_exit_code(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let pod = busybox_pod(
            "fails",
            &env.agent.node_name,
            &["sh", "-c", "exit 3"],
            "Never",
        )?;
        create(&pods, &pod).await?;
        let failed = wait_phase(&pods, "fails", "Failed").await?;
        let code = first_exit_code(failed);
        anyhow::ensure!(code == Some(3), "exit code {code:?}");
        pods.delete("fails", &DeleteParams::default()).await?;
        wait_gone(&pods, "fails", Duration::from_secs(30)).await
    })
}

/// The exit code of the pod's first container, once terminated.
fn first_exit_code(pod: Pod) -> Option<i32> {
    pod.status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state)
        .and_then(|s| s.terminated)
        .map(|t| t.exit_code)
}

/// A name longer than a DNS label (controllers generate them) is a valid pod name: the pod runs,
/// and its hostname is the name cut to 63 characters without trailing '-' or '.' (kubelet).
fn long_named_pod(env: &Env) -> Result<()> {
    // 69 characters; character 63 is a '-', so the hostname is the first 62.
    let name = format!("long-{}-tail-a", "x".repeat(57));
    let hostname = &name[..62];
    anyhow::ensure!(name.len() == 69 && name.as_bytes()[62] == b'-');
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let script = format!("[ \"$(hostname)\" = {hostname} ] || exit 7");
        let pod = busybox_pod(&name, &env.agent.node_name, &["sh", "-c", &script], "Never")?;
        create(&pods, &pod).await?;
        let done = eventually(&format!("pod {name} ends"), RUNNING_TIMEOUT, || async {
            let pod = pods.get(&name).await?;
            Ok(matches!(phase(&pod), "Succeeded" | "Failed").then_some(pod))
        })
        .await?;
        let exit = first_exit_code(done);
        anyhow::ensure!(exit == Some(0), "exit code {exit:?} (7: wrong hostname)");
        pods.delete(&name, &DeleteParams::default()).await?;
        wait_gone(&pods, &name, Duration::from_secs(30)).await
    })
}

/// The termination message file is writable by a non-root user at a non-default path
/// (kubelet makes it 0666), as the conformance suite checks.
fn non_root_termination_message(env: &Env) -> Result<()> {
    let name = "nonroot-termination";
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo -n DONE > /dev/termination-custom-log"],
                "terminationMessagePath": "/dev/termination-custom-log",
                "securityContext": { "runAsUser": 10000 },
            }],
        },
    }))?;
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        create(&pods, &pod).await?;
        let done = eventually(&format!("pod {name} ends"), RUNNING_TIMEOUT, || async {
            let pod = pods.get(name).await?;
            Ok(matches!(phase(&pod), "Succeeded" | "Failed").then_some(pod))
        })
        .await?;
        let terminated = done
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        let (exit, message) = (
            terminated.as_ref().map(|t| t.exit_code),
            terminated.and_then(|t| t.message).unwrap_or_default(),
        );
        anyhow::ensure!(
            exit == Some(0) && message == "DONE",
            "exit code {exit:?}, message {message:?} (1: the file was not writable)"
        );
        pods.delete(name, &DeleteParams::default()).await?;
        wait_gone(&pods, name, Duration::from_secs(30)).await
    })
}

/// The default `kube-api-access-*` volume the admission plugin adds: the token is issued
/// through TokenRequest, bound to the pod, and authenticates as the pod's service account.
fn service_account_token(env: &Env) -> Result<()> {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let script = "d=/var/run/secrets/kubernetes.io/serviceaccount; \
            test \"$(cat $d/namespace)\" = default || exit 8; \
            test -s $d/ca.crt || exit 9; \
            cat $d/token > /dev/termination-log";
        let pod = busybox_pod(
            "sa-token",
            &env.agent.node_name,
            &["sh", "-c", script],
            "Never",
        )?;
        create(&pods, &pod).await?;
        let done = eventually("pod sa-token finishes", RUNNING_TIMEOUT, || async {
            let pod = pods.get("sa-token").await?;
            Ok(matches!(phase(&pod), "Succeeded" | "Failed").then_some(pod))
        })
        .await?;
        let terminated = done
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        anyhow::ensure!(
            phase(&done) == "Succeeded",
            "the container found no usable service-account volume: {terminated:?}"
        );
        let token = terminated.and_then(|t| t.message).unwrap_or_default();
        anyhow::ensure!(token.split('.').count() == 3, "not a JWT: {token:?}");
        let review = TokenReview {
            spec: TokenReviewSpec {
                token,
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviews: Api<TokenReview> = Api::all(client);
        let status = reviews
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        let user = status.user.unwrap_or_default();
        anyhow::ensure!(
            status.authenticated == Some(true)
                && user.username.as_deref() == Some("system:serviceaccount:default:default"),
            "the API server rejects the token: error {:?}, user {:?}",
            status.error,
            user.username
        );
        let bound_pod = user
            .extra
            .unwrap_or_default()
            .remove("authentication.kubernetes.io/pod-name")
            .unwrap_or_default();
        anyhow::ensure!(bound_pod == ["sa-token"], "token bound to {bound_pod:?}");
        pods.delete("sa-token", &DeleteParams::default()).await?;
        wait_gone(&pods, "sa-token", Duration::from_secs(30)).await
    })
}

fn static_pod_mirror(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        env.agent.write_manifest(
            "web.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: web\n    image: busybox\n    imagePullPolicy: Never\n    command: [sleep, \"3604\"]\n",
        )?;
        let name = format!("web-{}", env.agent.node_name);
        let mirror = eventually("the mirror pod runs", RUNNING_TIMEOUT, || async {
            let Some(pod) = pods.get_opt(&name).await? else {
                return Ok(None);
            };
            let annotated = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
            Ok((annotated && phase(&pod) == "Running").then_some(pod))
        })
        .await?;
        let owner = mirror.metadata.owner_references.clone().unwrap_or_default();
        anyhow::ensure!(
            owner
                .iter()
                .any(|o| o.kind == "Node" && o.name == env.agent.node_name),
            "owner references {owner:?}"
        );
        let first_uid = mirror.metadata.uid.clone();
        pods.delete(&name, &DeleteParams::default()).await?;
        eventually(
            "the mirror pod is recreated",
            Duration::from_secs(30),
            || async {
                let pod = pods.get_opt(&name).await?;
                Ok(pod
                    .filter(|p| {
                        p.metadata.uid != first_uid && p.metadata.deletion_timestamp.is_none()
                    })
                    .map(|_| ()))
            },
        )
        .await?;
        anyhow::ensure!(process_running("sleep 3604"), "the static pod stopped");
        env.agent.remove_manifest("web.yaml")?;
        wait_gone(&pods, &name, Duration::from_secs(40)).await?;
        eventually("the static pod stops", Duration::from_secs(40), || async {
            Ok((!process_running("sleep 3604")).then_some(()))
        })
        .await
    })
}

fn missing_config_map(env: &Env) -> Result<()> {
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let maps: Api<ConfigMap> = Api::namespaced(client, "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "needs-config", "namespace": "default" },
            "spec": {
                "nodeName": env.agent.node_name,
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3605"],
                    "env": [{ "name": "GREETING", "valueFrom": {
                        "configMapKeyRef": { "name": "greeting", "key": "text" } } }],
                }],
            },
        }))?;
        create(&pods, &pod).await?;
        event_about(
            &events,
            "needs-config",
            "a warning event about the pod",
            |e| e.type_.as_deref() == Some("Warning"),
        )
        .await?;
        let waiting = pods.get("needs-config").await?;
        anyhow::ensure!(phase(&waiting) == "Pending", "phase {}", phase(&waiting));
        anyhow::ensure!(
            !process_running("sleep 3605"),
            "started without its ConfigMap"
        );
        let map: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": "greeting", "namespace": "default" },
            "data": { "text": "hello" },
        }))?;
        maps.create(&PostParams::default(), &map).await?;
        wait_phase(&pods, "needs-config", "Running").await?;
        pods.delete("needs-config", &DeleteParams::default().grace_period(1))
            .await?;
        wait_gone(&pods, "needs-config", Duration::from_secs(30)).await
    })
}

/// Issue 17: the pod fails its first sync (Warning event) and would retry only after the
/// 10 s error back-off; the ConfigMap's watch resyncs it as soon as the ConfigMap exists.
fn config_map_watch_starts_waiting_pod(env: &Env) -> Result<()> {
    const POD: &str = "waits-for-late-map";
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let maps: Api<ConfigMap> = Api::namespaced(client, "default");
        let mut pod = busybox_pod(POD, &env.agent.node_name, &["sleep", "3607"], "Always")?;
        if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            c.env = Some(vec![serde_json::from_value(json!({
                "name": "LATE", "valueFrom": { "configMapKeyRef": { "name": "late-map", "key": "k" } },
            }))?]);
        }
        create(&pods, &pod).await?;
        event_about(&events, POD, "the pod's failed-sync warning", |e| {
            e.type_.as_deref() == Some("Warning")
        })
        .await?;
        anyhow::ensure!(
            env.agent
                .plain_log()
                .contains("watching ConfigMap default/late-map"),
            "the agent did not start a watch of default/late-map"
        );
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "late-map", "namespace": "default" },
            "data": { "k": "v" },
        }))?;
        let created = std::time::Instant::now();
        maps.create(&PostParams::default(), &map).await?;
        let running = wait_phase(&pods, POD, "Running").await;
        let latency = created.elapsed();
        eprintln!("ConfigMap created -> pod Running: {latency:?}");
        pods.delete(POD, &DeleteParams::default().grace_period(1))
            .await?;
        wait_gone(&pods, POD, Duration::from_secs(30)).await?;
        maps.delete("late-map", &DeleteParams::default()).await?;
        running?;
        anyhow::ensure!(
            latency < Duration::from_secs(4),
            "the pod ran {latency:?} after its ConfigMap was created"
        );
        eventually(
            "the watch of default/late-map stopped",
            Duration::from_secs(10),
            || async {
                Ok(env
                    .agent
                    .plain_log()
                    .contains("stopped watching ConfigMap default/late-map")
                    .then_some(()))
            },
        )
        .await
    })
}

/// `GET /metrics` on the agent's local socket.
fn agent_metrics(env: &Env) -> Result<String> {
    use std::io::{Read, Write};
    let socket = env.agent.root.join("ironlet.sock");
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}

/// The value of `ironlet_object_watches{kind="secret"}` (no other test references Secrets).
fn secret_watches(env: &Env) -> Result<f64> {
    let metrics = agent_metrics(env)?;
    let value = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ironlet_object_watches{kind=\"secret\"} "))
        .unwrap_or("0");
    Ok(value.trim().parse()?)
}

/// The last line the pod's container printed (from its log file on the node).
fn last_output_line(env: &Env, pod: &str) -> String {
    let prefix = format!("default_{pod}_");
    let Ok(dirs) = std::fs::read_dir(env.agent.root.join("logs")) else {
        return String::new();
    };
    let mut text = String::new();
    for dir in dirs.flatten() {
        if dir.file_name().to_string_lossy().starts_with(&prefix) {
            let main = dir.path().join("main");
            for file in std::fs::read_dir(main).into_iter().flatten().flatten() {
                text = std::fs::read_to_string(file.path()).unwrap_or_default();
            }
        }
    }
    text.lines().last().unwrap_or_default().to_owned()
}

/// Waits until the last line `pod`'s container printed ends with `want`.
async fn wait_output(env: &Env, pod: &str, want: &str, timeout: Duration) -> Result<()> {
    eventually(&format!("the container prints {want}"), timeout, || async {
        Ok(last_output_line(env, pod).ends_with(want).then_some(()))
    })
    .await
}

/// Issue 17: a ConfigMap and a Secret mounted as volumes; both are updated; the container
/// (printing both every 0.2 s) sees the new values within 10 s; deleting the pod stops the
/// Secret's and the ConfigMap's watches.
fn live_volume_updates(env: &Env) -> Result<()> {
    const POD: &str = "live-volumes";
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let secrets: Api<Secret> = Api::namespaced(client, "default");
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "live-map", "namespace": "default" },
            "data": { "v": "one" },
        }))?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "live-secret", "namespace": "default" },
            "stringData": { "v": "one" },
        }))?;
        maps.create(&PostParams::default(), &map).await?;
        secrets.create(&PostParams::default(), &secret).await?;
        let before = secret_watches(env)?;
        let mut pod = busybox_pod(
            POD,
            &env.agent.node_name,
            &[
                "sh",
                "-c",
                "while true; do echo \"cm=$(cat /cm/v) secret=$(cat /secret/v)\"; sleep 0.2; done",
            ],
            "Always",
        )?;
        if let Some(spec) = pod.spec.as_mut() {
            spec.volumes = Some(serde_json::from_value(json!([
                { "name": "cm", "configMap": { "name": "live-map" } },
                { "name": "secret", "secret": { "secretName": "live-secret" } },
            ]))?);
            if let Some(c) = spec.containers.first_mut() {
                c.volume_mounts = Some(serde_json::from_value(json!([
                    { "name": "cm", "mountPath": "/cm" },
                    { "name": "secret", "mountPath": "/secret" },
                ]))?);
            }
        }
        create(&pods, &pod).await?;
        let result = async {
            wait_phase(&pods, POD, "Running").await?;
            wait_output(env, POD, "cm=one secret=one", Duration::from_secs(20)).await?;
            anyhow::ensure!(
                secret_watches(env)? >= before + 1.0,
                "no Secret watch while the pod runs"
            );
            let patch = PatchParams::default();
            let updated = std::time::Instant::now();
            maps.patch(
                "live-map",
                &patch,
                &Patch::Merge(json!({ "data": { "v": "two" } })),
            )
            .await?;
            secrets
                .patch(
                    "live-secret",
                    &patch,
                    &Patch::Merge(json!({ "stringData": { "v": "two" } })),
                )
                .await?;
            wait_output(env, POD, "cm=two secret=two", Duration::from_secs(10)).await?;
            eprintln!(
                "ConfigMap/Secret updated -> seen in the container: {:?}",
                updated.elapsed()
            );
            Ok(())
        }
        .await;
        pods.delete(POD, &DeleteParams::default().grace_period(1))
            .await?;
        wait_gone(&pods, POD, Duration::from_secs(30)).await?;
        maps.delete("live-map", &DeleteParams::default()).await?;
        secrets
            .delete("live-secret", &DeleteParams::default())
            .await?;
        result?;
        eventually(
            "the Secret watch stopped",
            Duration::from_secs(10),
            || async { Ok((secret_watches(env)? <= before).then_some(())) },
        )
        .await?;
        anyhow::ensure!(
            env.agent
                .plain_log()
                .contains("stopped watching ConfigMap default/live-map"),
            "the ConfigMap watch did not stop"
        );
        Ok(())
    })
}

/// A pod that writes 20 MiB into an emptyDir limited to 1Mi is evicted as kubelet evicts it:
/// phase Failed, reason `Evicted`, kubelet's message, a Warning `Evicted` event, its
/// container stopped and not restarted.
fn empty_dir_eviction(env: &Env) -> Result<()> {
    const MESSAGE: &str = "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ";
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client, "default");
        let mut pod = busybox_pod(
            "fills-disk",
            &env.agent.node_name,
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/scratch/fill bs=1M count=20; exec sleep 3606",
            ],
            "Always",
        )?;
        let spec = pod.spec.as_mut().context("pod spec")?;
        spec.volumes = Some(vec![serde_json::from_value(
            json!({ "name": "scratch", "emptyDir": { "sizeLimit": "1Mi" } }),
        )?]);
        let main = spec.containers.first_mut().context("container")?;
        main.volume_mounts = Some(vec![serde_json::from_value(
            json!({ "name": "scratch", "mountPath": "/scratch" }),
        )?]);
        create(&pods, &pod).await?;
        let failed = wait_phase(&pods, "fills-disk", "Failed").await?;
        ensure_failed_by_node(&failed, &events, "Evicted", "Warning", MESSAGE).await?;
        eventually("the container stopped", Duration::from_secs(30), || async {
            Ok((!process_running("sleep 3606")).then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = pods.get("fills-disk").await?;
        let restarts: i32 = after
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .map(|c| c.restart_count)
            .sum();
        anyhow::ensure!(
            phase(&after) == "Failed" && restarts == 0 && !process_running("sleep 3606"),
            "evicted pod came back: phase {}, restarts {restarts}",
            phase(&after)
        );
        pods.delete("fills-disk", &DeleteParams::default()).await?;
        wait_gone(&pods, "fills-disk", Duration::from_secs(30)).await
    })
}

/// The conformance spec "Pods should allow activeDeadlineSeconds to be updated": a running
/// pod's deadline patched from 300 s to 2 s ends it with kubelet's `DeadlineExceeded`.
fn active_deadline_shortened(env: &Env) -> Result<()> {
    const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client, "default");
        let mut pod = busybox_pod(
            "deadline",
            &env.agent.node_name,
            &["sleep", "3609"],
            "Always",
        )?;
        let spec = pod.spec.as_mut().context("pod spec")?;
        spec.active_deadline_seconds = Some(300);
        spec.termination_grace_period_seconds = Some(2);
        create(&pods, &pod).await?;
        wait_phase(&pods, "deadline", "Running").await?;
        let patch = json!({ "spec": { "activeDeadlineSeconds": 2 } });
        pods.patch("deadline", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let failed = eventually("pod deadline Failed", Duration::from_secs(20), || async {
            let pod = pods.get("deadline").await?;
            Ok((phase(&pod) == "Failed").then_some(pod))
        })
        .await?;
        ensure_failed_by_node(&failed, &events, "DeadlineExceeded", "Normal", MESSAGE).await?;
        eventually("the container stopped", Duration::from_secs(15), || async {
            Ok((!process_running("sleep 3609")).then_some(()))
        })
        .await?;
        pods.delete("deadline", &DeleteParams::default()).await?;
        wait_gone(&pods, "deadline", Duration::from_secs(30)).await
    })
}

/// The pod's generation, its `status.observedGeneration` and the observed generations of
/// the conditions the kubelet writes, in kubelet's order.
fn generations(pod: &Pod) -> (i64, Option<i64>, Vec<Option<i64>>) {
    const KUBELET_CONDITIONS: [&str; 5] = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ];
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let observed = KUBELET_CONDITIONS
        .iter()
        .map(|t| {
            conditions
                .iter()
                .find(|c| c.type_ == *t)
                .and_then(|c| c.observed_generation)
        })
        .collect();
    (
        pod.metadata.generation.unwrap_or(0),
        status.observed_generation,
        observed,
    )
}

/// Waits (20 s, the e2e spec's bound) for pod `generation` at generation `want` with every
/// observed generation `want`.
async fn observes(pods: &Api<Pod>, want: i64) -> Result<()> {
    let waited = eventually(
        &format!("observedGeneration {want}"),
        Duration::from_secs(20),
        || async {
            let pod = pods.get("generation").await?;
            Ok((generations(&pod) == (want, Some(want), vec![Some(want); 5])).then_some(()))
        },
    )
    .await;
    if waited.is_err() {
        let last = pods.get("generation").await.map(|p| generations(&p));
        return waited
            .with_context(|| format!("last seen (generation, status, conditions): {last:?}"));
    }
    waited
}

/// PodObservedGenerationTracking (GA in 1.35), as the e2e "Pods Extended (pod generation)"
/// specs check it: `status.observedGeneration` and the kubelet's conditions'
/// `observedGeneration` are the generation of the pod the status was computed from, and
/// follow each update that bumps it (`activeDeadlineSeconds`, tolerations) within the
/// spec's 20 s; a metadata-only update bumps nothing.
fn observed_generation(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let mut pod = busybox_pod(
            "generation",
            &env.agent.node_name,
            &["sleep", "3608"],
            "Always",
        )?;
        let spec = pod.spec.as_mut().context("pod spec")?;
        spec.active_deadline_seconds = Some(5000);
        spec.termination_grace_period_seconds = Some(2);
        create(&pods, &pod).await?;
        wait_phase(&pods, "generation", "Running").await?;
        observes(&pods, 1).await?;
        let updates = [
            (json!({ "spec": { "activeDeadlineSeconds": 4000 } }), 2),
            (
                json!({ "spec": { "tolerations": [
                    { "key": "example.com/t", "operator": "Equal", "value": "v", "effect": "NoSchedule" }
                ] } }),
                3,
            ),
            (
                json!({ "metadata": { "annotations": { "example.com/a": "b" } } }),
                3,
            ),
        ];
        for (patch, want) in updates {
            pods.patch("generation", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            observes(&pods, want)
                .await
                .with_context(|| format!("after {patch}"))?;
        }
        pods.delete("generation", &DeleteParams::default()).await?;
        wait_gone(&pods, "generation", Duration::from_secs(30)).await
    })
}

/// Sends `signal` to the apiserver's process group (its pid is in the state directory).
fn signal_apiserver(env: &Env, signal: nix::sys::signal::Signal) -> Result<()> {
    let pid: i32 = std::fs::read_to_string(env.plane.dir().join("kube-apiserver.pid"))
        .context("reading the apiserver pid")?
        .trim()
        .parse()
        .context("parsing the apiserver pid")?;
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal)
        .or_else(|_| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal))
        .context("signalling the apiserver")
}

fn apiserver_outage(env: &Env) -> Result<()> {
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let nodes: Api<Node> = Api::all(client);
        let steady = busybox_pod("steady", &env.agent.node_name, &["sleep", "3606"], "Always")?;
        let finishing = busybox_pod(
            "finishing",
            &env.agent.node_name,
            &["sh", "-c", "sleep 20; exit 0"],
            "Never",
        )?;
        create(&pods, &steady).await?;
        create(&pods, &finishing).await?;
        wait_phase(&pods, "steady", "Running").await?;
        wait_phase(&pods, "finishing", "Running").await?;

        // The apiserver freezes: requests hang, as when it is unreachable.
        signal_apiserver(env, nix::sys::signal::Signal::SIGSTOP)?;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let still_running = process_running("sleep 3606");
        signal_apiserver(env, nix::sys::signal::Signal::SIGCONT)?;
        anyhow::ensure!(still_running, "the steady pod stopped during the outage");

        let resumed = k8s_openapi::jiff::Timestamp::now();
        eventually(
            "the finished pod's status converges",
            Duration::from_secs(10),
            || async {
                let pod = pods.get("finishing").await?;
                Ok((phase(&pod) == "Succeeded").then_some(()))
            },
        )
        .await?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(admin(env).await?, "kube-node-lease");
        eventually(
            "the node's lease is renewed again",
            Duration::from_secs(10),
            || async {
                let lease = leases.get(&env.agent.node_name).await?;
                Ok(lease
                    .spec
                    .and_then(|s| s.renew_time)
                    .filter(|t| t.0 >= resumed)
                    .map(|_| ()))
            },
        )
        .await?;
        eventually("the node is Ready", Duration::from_secs(10), || async {
            let node = nodes.get(&env.agent.node_name).await?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"));
            Ok(ready.filter(|c| c.status == "True").map(|_| ()))
        })
        .await?;
        let steady = pods.get("steady").await?;
        anyhow::ensure!(phase(&steady) == "Running", "steady is {}", phase(&steady));
        for name in ["steady", "finishing"] {
            pods.delete(name, &DeleteParams::default().grace_period(1))
                .await?;
        }
        for name in ["steady", "finishing"] {
            wait_gone(&pods, name, Duration::from_secs(30)).await?;
        }
        Ok(())
    })
}

/// A readiness probe that fails gets kubelet's Warning `Unhealthy` event in the API,
/// `Readiness probe failed: ` followed by the command's output; the pod stays not ready.
fn readiness_unhealthy_event(env: &Env) -> Result<()> {
    block_on(async {
        let client = admin(env).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let events: Api<Event> = Api::namespaced(client, "default");
        let mut pod = busybox_pod(
            "unready",
            &env.agent.node_name,
            &["sleep", "3608"],
            "Always",
        )?;
        let main = pod
            .spec
            .as_mut()
            .and_then(|s| s.containers.first_mut())
            .context("the pod has its container")?;
        main.readiness_probe = Some(serde_json::from_value(json!({
            "exec": { "command": ["sh", "-c", "echo not-ready-$((1+1)); exit 1"] },
            "periodSeconds": 1,
        }))?);
        create(&pods, &pod).await?;
        let event = event_about(&events, "unready", "an Unhealthy event", |e| {
            e.reason.as_deref() == Some("Unhealthy")
        })
        .await?;
        anyhow::ensure!(
            event.type_.as_deref() == Some("Warning")
                && event.message.as_deref() == Some("Readiness probe failed: not-ready-2\n"),
            "event {:?} {:?}",
            event.type_,
            event.message
        );
        let running = pods.get("unready").await?;
        let ready = running
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status);
        anyhow::ensure!(ready.as_deref() == Some("False"), "Ready {ready:?}");
        pods.delete("unready", &DeleteParams::default().grace_period(1))
            .await?;
        wait_gone(&pods, "unready", Duration::from_secs(30)).await
    })
}

fn scheduled_pod_runs(env: &Env) -> Result<()> {
    block_on(async {
        let pods: Api<Pod> = Api::namespaced(admin(env).await?, "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "scheduled", "namespace": "default" },
            "spec": {
                "nodeSelector": { "kubernetes.io/hostname": env.agent.node_name },
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3607"],
                    "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } },
                }],
            },
        }))?;
        create(&pods, &pod).await?;
        let running = wait_phase(&pods, "scheduled", "Running").await?;
        let node = running.spec.and_then(|s| s.node_name);
        anyhow::ensure!(
            node.as_deref() == Some(env.agent.node_name.as_str()),
            "scheduled to {node:?}"
        );
        let qos = running.status.and_then(|s| s.qos_class);
        anyhow::ensure!(qos.as_deref() == Some("Burstable"), "qosClass {qos:?}");
        pods.delete("scheduled", &DeleteParams::default()).await?;
        wait_gone(&pods, "scheduled", Duration::from_secs(30)).await
    })
}

//! Probes and hook actions against real containers, as root: httpGet and tcpSocket into a
//! pod that has its own network namespace but no IP (connected from inside the pinned
//! namespace), exec success, failure and timeout, and a liveness worker reaching its
//! failure threshold. A custom harness (`harness = false`) forks the zygote before any
//! thread exists, as the binary does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use ironlet::probes::{
    run_handler, Action, HttpGet, PortRef, ProbeKind, ProbeManager, ProbeNetwork, ProbeOutcome,
    ProbeResult, ProbeTarget, RunningContainer, Scheme,
};
use ironlet_runtime::types::{ContainerId, PodSandboxConfig, SandboxId};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ExecAction, HTTPGetAction, LifecycleHandler, Pod, PodSpec, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use libtest_mimic::{Arguments, Failed, Trial};

type TestFn = fn(&Env) -> Result<()>;

struct Env {
    rt: tokio::runtime::Runtime,
    runtime: Arc<LocalRuntime>,
    root: PathBuf,
}

/// A pod sandbox with one container serving HTTP on 8080 from inside its own namespace.
struct WebPod {
    sandbox: SandboxId,
    container: ContainerId,
    started_at: SystemTime,
    target: ProbeTarget,
}

const ONE_SECOND: Duration = Duration::from_secs(1);
const HTTPD: &str = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www";

fn main() {
    let args = Arguments::from_args();
    if !nix::unistd::geteuid().is_root() {
        println!("probes: skipped, needs root");
        return;
    }
    // Before any thread: the zygote forks from a single-threaded process.
    let zygote = match ironlet_runtime::zygote::spawn() {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn the zygote: {e}");
            std::process::exit(1);
        }
    };
    let env = match setup(zygote) {
        Ok(env) => Arc::new(env),
        Err(e) => {
            eprintln!("test setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "http_get_reaches_a_pod_without_an_ip_through_its_network_namespace",
            http_get_through_netns,
        ),
        (
            "tcp_socket_succeeds_on_a_listening_port_and_fails_on_a_closed_one",
            tcp_socket_both_ways,
        ),
        (
            "exec_succeeds_on_exit_zero_and_fails_with_its_output_otherwise",
            exec_both_ways,
        ),
        (
            "a_hung_exec_fails_as_a_timeout_within_about_the_timeout",
            exec_timeout,
        ),
        (
            "a_post_start_exec_hook_runs_inside_the_container",
            post_start_exec_hook,
        ),
        (
            "the_manager_reports_ready_then_a_liveness_failure_after_the_threshold",
            liveness_threshold,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let env = env.clone();
            Trial::test(name, move || {
                f(&env).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let root = env.root.clone();
    drop(env);
    let _ = std::fs::remove_dir_all(root);
    ironlet_runtime::testkit::remove_cgroup_parent(&cgroup_parent_name());
    conclusion.exit();
}

fn cgroup_parent_name() -> String {
    format!("ironlet-probes-test-{}", std::process::id())
}

fn setup(zygote: ironlet_runtime::zygote::ZygoteHandle) -> Result<Env> {
    let root = std::env::temp_dir().join(format!("ironlet-probes-test-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let runtime = rt.block_on(async {
        let store = ironlet_runtime::testkit::busybox_store(&root).await?;
        let config = LocalRuntimeConfig {
            root_dir: root.clone(),
            rootless: false,
            default_cgroup_parent: Some(format!("/{}", cgroup_parent_name())),
            cni: None,
            log_rotation: Default::default(),
        };
        anyhow::Ok(LocalRuntime::new(config, zygote, store).await?)
    })?;
    Ok(Env {
        rt,
        runtime: Arc::new(runtime),
        root,
    })
}

/// Runs `test` on the shared runtime, failing (not hanging) after `secs`.
fn run<F: std::future::Future<Output = Result<()>>>(env: &Env, secs: u64, test: F) -> Result<()> {
    env.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(secs), test)
            .await
            .with_context(|| format!("no result within {secs}s: a probe or the runtime hung"))?
    })
}

/// Starts a sandbox with its own network namespace and a container running `script`.
async fn start_pod(env: &Env, name: &str, script: &str) -> Result<WebPod> {
    let uid = ContainerId::random().to_string();
    let sandbox = env
        .runtime
        .run_pod_sandbox(&PodSandboxConfig {
            pod_uid: uid.clone(),
            name: name.to_owned(),
            namespace: "test".into(),
            hostname: name.to_owned(),
            log_directory: env.root.join("logs").join(format!("test_{name}_{uid}")),
            ..PodSandboxConfig::default()
        })
        .await?;
    let config = ironlet_runtime::testkit::busybox_sh(name, script);
    let container = env.runtime.create_container(&sandbox, &config).await?;
    env.runtime.start_container(&container).await?;
    let status = env.runtime.container_status(&container).await?;
    let sandbox_status = env.runtime.pod_sandbox_status(&sandbox).await?;
    Ok(WebPod {
        sandbox,
        started_at: status.started_at.unwrap_or_else(SystemTime::now),
        target: ProbeTarget {
            container_id: container.clone(),
            network: ProbeNetwork {
                ip: sandbox_status.ip,
                netns_path: sandbox_status.netns_path,
            },
            container_ports: vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..ContainerPort::default()
            }],
        },
        container,
    })
}

async fn cleanup(env: &Env, pod: &WebPod) -> Result<()> {
    env.runtime.stop_pod_sandbox(&pod.sandbox).await?;
    env.runtime.remove_pod_sandbox(&pod.sandbox).await?;
    Ok(())
}

fn tcp(port: u16) -> Action {
    Action::TcpSocket {
        host: None,
        port: PortRef::Number(port),
    }
}

fn http(port: PortRef, path: &str) -> Action {
    Action::HttpGet(HttpGet {
        scheme: Scheme::Http,
        host: None,
        port,
        path: path.to_owned(),
        headers: Vec::new(),
    })
}

fn exec(args: &[&str]) -> Action {
    Action::Exec {
        command: args.iter().map(|s| (*s).to_owned()).collect(),
    }
}

async fn probe(env: &Env, pod: &WebPod, action: &Action) -> ProbeOutcome {
    run_handler(env.runtime.as_ref(), &pod.target, action, ONE_SECOND).await
}

/// Waits until httpd accepts connections on 8080.
async fn wait_for_httpd(env: &Env, pod: &WebPod) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = probe(env, pod, &tcp(8080)).await;
        if outcome.is_success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("httpd did not listen on 8080 within 10 s: {outcome:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn http_get_through_netns(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "web", HTTPD).await?;
        ensure!(
            pod.target.network.ip.is_none() && pod.target.network.netns_path.is_some(),
            "the test needs a pod with a namespace and no IP: {:?}",
            pod.target.network
        );
        wait_for_httpd(env, &pod).await?;
        let ok = probe(env, &pod, &http(PortRef::Number(8080), "/")).await;
        ensure!(ok == ProbeOutcome::Success, "GET / on 8080: {ok:?}");
        let named = probe(
            env,
            &pod,
            &http(PortRef::Name("http".into()), "/index.html"),
        )
        .await;
        ensure!(
            named == ProbeOutcome::Success,
            "GET by port name: {named:?}"
        );
        let missing = probe(env, &pod, &http(PortRef::Number(8080), "/missing")).await;
        ensure!(
            missing == ProbeOutcome::Failure("HTTP probe failed with statuscode: 404".into()),
            "GET /missing: {missing:?}"
        );
        let closed = probe(env, &pod, &http(PortRef::Number(8081), "/")).await;
        ensure!(
            matches!(&closed, ProbeOutcome::Failure(m) if m.contains("refused")),
            "GET on a closed port: {closed:?}"
        );
        let unknown_name = probe(env, &pod, &http(PortRef::Name("admin".into()), "/")).await;
        ensure!(
            matches!(unknown_name, ProbeOutcome::Unknown(_)),
            "a port name the container does not declare: {unknown_name:?}"
        );
        cleanup(env, &pod).await
    })
}

fn tcp_socket_both_ways(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "tcp", HTTPD).await?;
        wait_for_httpd(env, &pod).await?;
        let open = probe(env, &pod, &tcp(8080)).await;
        ensure!(open == ProbeOutcome::Success, "open port: {open:?}");
        let closed = probe(env, &pod, &tcp(9)).await;
        ensure!(
            matches!(&closed, ProbeOutcome::Failure(m) if m.contains("127.0.0.1:9")),
            "closed port: {closed:?}"
        );
        cleanup(env, &pod).await
    })
}

fn exec_both_ways(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "exec", "sleep 60").await?;
        let ok = probe(env, &pod, &exec(&["true"])).await;
        ensure!(ok == ProbeOutcome::Success, "true: {ok:?}");
        let failed = probe(env, &pod, &exec(&["sh", "-c", "echo sick; exit 3"])).await;
        ensure!(
            failed == ProbeOutcome::Failure("sick\n".into()),
            "exit 3 fails with the output as kubelet's exec prober: {failed:?}"
        );
        cleanup(env, &pod).await
    })
}

fn exec_timeout(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "hung", "sleep 60").await?;
        let started = Instant::now();
        let outcome = probe(env, &pod, &exec(&["sleep", "5"])).await;
        let took = started.elapsed();
        ensure!(
            matches!(&outcome, ProbeOutcome::Failure(m) if m.contains("timed out")),
            "sleep 5 with a 1 s timeout: {outcome:?}"
        );
        ensure!(
            took >= Duration::from_millis(900) && took < Duration::from_millis(1800),
            "the timeout took {took:?}"
        );
        cleanup(env, &pod).await
    })
}

fn post_start_exec_hook(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "hook", "sleep 60").await?;
        let hook = Action::from_lifecycle_handler(&LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["touch".into(), "/hooked".into()]),
            }),
            ..LifecycleHandler::default()
        })?;
        let outcome = run_handler(env.runtime.as_ref(), &pod.target, &hook, ONE_SECOND * 5).await;
        ensure!(outcome == ProbeOutcome::Success, "hook: {outcome:?}");
        let check = probe(env, &pod, &exec(&["test", "-f", "/hooked"])).await;
        ensure!(
            check == ProbeOutcome::Success,
            "the hook left no file: {check:?}"
        );
        cleanup(env, &pod).await
    })
}

fn liveness_threshold(env: &Env) -> Result<()> {
    run(env, 60, async {
        let pod = start_pod(env, "live", HTTPD).await?;
        let spec = Container {
            name: "live".into(),
            ports: Some(pod.target.container_ports.clone()),
            liveness_probe: Some(Probe {
                exec: Some(ExecAction {
                    command: Some(vec!["sh".into(), "-c".into(), "exit 1".into()]),
                }),
                period_seconds: Some(1),
                failure_threshold: Some(3),
                ..Probe::default()
            }),
            readiness_probe: Some(Probe {
                http_get: Some(HTTPGetAction {
                    port: IntOrString::String("http".into()),
                    path: Some("/".into()),
                    ..HTTPGetAction::default()
                }),
                period_seconds: Some(1),
                ..Probe::default()
            }),
            ..Container::default()
        };
        let uid = "live-pod-uid";
        let manifest = Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some("live".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![spec],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let (manager, mut updates) = ProbeManager::new(env.runtime.clone());
        let running = RunningContainer {
            name: "live".into(),
            id: pod.container.clone(),
            started_at: pod.started_at,
            carried: Default::default(),
        };
        let started = Instant::now();
        manager.update_pod(&manifest, &[running], &pod.target.network);
        ensure!(
            !manager.is_ready(uid, "live", &pod.container),
            "ready before any probe"
        );
        let mut ready_at = None;
        let mut failed_at = None;
        let mut unhealthy = Vec::new();
        while failed_at.is_none() {
            let update = updates.recv().await.context("the update channel closed")?;
            if let Some(event) = &update.event {
                unhealthy.push((event.reason(), event.message(update.kind)));
                continue;
            }
            match (update.kind, update.result) {
                (ProbeKind::Readiness, ProbeResult::Success) => ready_at = Some(started.elapsed()),
                (ProbeKind::Liveness, ProbeResult::Failure) => failed_at = Some(started.elapsed()),
                other => bail!("unexpected update {other:?}: {update:?}"),
            }
        }
        let failed_at = failed_at.unwrap_or_default();
        ensure!(ready_at.is_some(), "readiness never reported Success");
        ensure!(manager.is_ready(uid, "live", &pod.container));
        // Failures at about 0 s, 1 s and 2 s: published on the third.
        ensure!(
            failed_at >= Duration::from_millis(1900) && failed_at < Duration::from_millis(3500),
            "liveness failed after {failed_at:?}"
        );
        ensure!(
            unhealthy.len() == 3
                && unhealthy
                    .iter()
                    .all(|(reason, message)| *reason == "Unhealthy"
                        && message.starts_with("Liveness probe failed: ")),
            "not one Unhealthy event per failed liveness run: {unhealthy:?}"
        );
        ensure!(manager.liveness_failed(uid, "live", &pod.container));
        ensure!(manager.restart_reason(uid, "live", &pod.container) == Some(ProbeKind::Liveness));
        manager.remove_pod(uid);
        ensure!(manager.readiness(uid, "live").is_none());
        cleanup(env, &pod).await
    })
}

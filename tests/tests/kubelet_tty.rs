//! Terminals through the kubelet API of a real `ironlet run --kubeconfig` joined to a real
//! control plane (`scripts/controlplane`), driven by the real `kubectl` on a pseudo-terminal
//! as a person would type (`ironlet_runtime::testkit::pty`):
//! - `kubectl exec -it POD -- sh`: the prompt appears, a command's output comes back, the
//!   window size kubectl starts with and a later resize are what `stty size` reports inside,
//!   `exit 3` makes kubectl exit 3, and kubectl restores the terminal it made raw;
//! - `kubectl attach -it` to a pod with `stdin` and `tty` running `sh`: a command typed
//!   reaches the container's shell and its output comes back; kubectl killed (detached),
//!   the agent restarted (SIGHUP), a new attach answers again (the terminal was held by the
//!   supervisor), both sessions' output is in `kubectl logs`, and `exit 7` ends the
//!   container (terminated, exit code 7) and the attach;
//! - `kubectl run -it --rm --restart=Never --image=busybox -- sh`: a command's output comes
//!   back, `exit` ends kubectl with 0 and the pod is deleted.
//!
//! One control plane and one agent (node `e2e-ktty-<pid>`) serve every test; pods are
//! removed by each test. Needs root (containers, cgroups, CNI).

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ironlet_e2e::{
    block_on, eventually, routable_host_ip, run_suite, ClusterAgent, ControlPlane, SuiteTest,
};
use ironlet_runtime::testkit::pty::PtyChild;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
}

const TESTS: &[SuiteTest<Env>] = &[
    (
        "kubectl_exec_it_runs_a_shell_resizes_and_exits_with_its_code",
        exec_it,
    ),
    (
        "kubectl_attach_it_types_into_the_shell_and_attaches_again_after_an_agent_restart",
        attach_it,
    ),
    (
        "kubectl_run_it_rm_runs_a_shell_and_removes_the_pod",
        run_it_rm,
    ),
];

/// How long one prompt or answer may take through kubectl, the API server and the node.
const ANSWER: Duration = Duration::from_secs(30);

fn main() {
    run_suite("kubelet_tty", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    });
}

fn start() -> Result<Env> {
    let plane = ControlPlane::up()?;
    let node = format!("e2e-ktty-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    let node_ip = routable_host_ip().context("no routable host address for the node")?;
    let slot = 100 + (std::process::id() + 77) % 150;
    let agent = ClusterAgent::start_on(&kubeconfig, &node, slot, &[], node_ip)?;
    Ok(Env { plane, agent })
}

/// A busybox pod on the test node running `command`, with `stdin`/`tty` as given.
async fn run_pod(env: &Env, name: &str, command: &[&str], terminal: bool) -> Result<Api<Pod>> {
    let client = env.plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": command,
                "stdin": terminal,
                "tty": terminal,
            }],
        },
    }))?;
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), &pod).await?;
        Ok(Some(()))
    })
    .await?;
    eventually(
        &format!("pod {name} running"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await?;
            let running = pod
                .status
                .and_then(|s| s.container_statuses)
                .into_iter()
                .flatten()
                .any(|c| c.state.is_some_and(|s| s.running.is_some()));
            Ok(running.then_some(()))
        },
    )
    .await?;
    Ok(pods)
}

/// Deletes the pod and waits until it is gone (the node removed its containers).
async fn remove_pod(pods: &Api<Pod>, name: &str) -> Result<()> {
    let _ = pods.delete(name, &DeleteParams::default()).await;
    eventually(
        &format!("pod {name} gone"),
        Duration::from_secs(60),
        || async { Ok(pods.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

/// `kubectl ARGS…` on a new terminal of 100×30.
fn kubectl_on_pty(env: &Env, args: &[&str]) -> Result<PtyChild> {
    let mut command: Command = env.plane.kubectl_command();
    command.args(args);
    PtyChild::spawn(command, 100, 30).context("starting kubectl on a pty")
}

fn exec_it(env: &Env) -> Result<()> {
    let name = "ktty-exec";
    let _shared = RESTART
        .read()
        .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    block_on(async {
        let pods = run_pod(env, name, &["sleep", "3600"], false).await?;
        let result = async {
            let mut kubectl = kubectl_on_pty(env, &["exec", "-it", name, "--", "sh"])?;
            kubectl.expect("/ # ", ANSWER)?;
            // Raw mode while the session runs: no local echo, no line editing.
            let flags = kubectl.local_flags()?;
            ensure!(
                !flags.contains(nix::sys::termios::LocalFlags::ICANON),
                "kubectl did not put the terminal in raw mode: {flags:?}"
            );
            kubectl.send("echo hello-$((6*7))\r")?;
            kubectl.expect("hello-42\r\n", ANSWER)?;
            // The terminal is one of the container's own ptys, as runc gives.
            kubectl.send("[ -c \"$(tty)\" ] && echo named-$((3+4)) $(tty)\r")?;
            kubectl.expect("named-7 /dev/pts/", ANSWER)?;
            // The size kubectl started with, then a resize (kubectl's SIGWINCH handler).
            kubectl.send("stty size; echo size-$((1+1))\r")?;
            let before = kubectl.expect("size-2\r\n", ANSWER)?;
            ensure!(before.contains("30 100\r\n"), "initial size: {before:?}");
            kubectl.resize(77, 22)?;
            let mut resized = false;
            for _ in 0..50 {
                kubectl.send("stty size; echo size-$((2+1))\r")?;
                let shown = kubectl.expect("size-3\r\n", ANSWER)?;
                if shown.contains("22 77\r\n") {
                    resized = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            ensure!(
                resized,
                "the resize never reached the container: {}",
                kubectl.seen()
            );
            kubectl.send("exit 3\r")?;
            let status = kubectl.wait(ANSWER)?.context("kubectl exec did not end")?;
            ensure!(
                status.code() == Some(3),
                "kubectl exec: {status}; {}",
                kubectl.seen()
            );
            let flags = kubectl.local_flags()?;
            ensure!(
                flags.contains(nix::sys::termios::LocalFlags::ICANON),
                "kubectl did not restore the terminal: {flags:?}"
            );
            Ok(())
        }
        .await;
        remove_pod(&pods, name).await?;
        result
    })
}

/// Serialises the agent restart of [`attach_it`] against the other tests' sessions.
static RESTART: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Attaches with `kubectl attach -it` and types until the container's shell answers
/// (the attach may take a moment, and output from before it is not shown); `tag` makes
/// the answer unique. Retries kubectl itself while the node's API is not up.
fn attach_and_answer(env: &Env, name: &str, tag: u32) -> Result<PtyChild> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut kubectl = kubectl_on_pty(env, &["attach", "-it", name, "-c", "main"])?;
        for i in 0..20 {
            let n = tag + i;
            kubectl.send(&format!("echo attached-$(({n}-1+1))\r"))?;
            if kubectl
                .expect(&format!("attached-{n}\r\n"), Duration::from_secs(1))
                .is_ok()
            {
                return Ok(kubectl);
            }
            if kubectl.wait(Duration::ZERO)?.is_some() {
                break;
            }
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no answer through attach: {}",
            kubectl.seen()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn attach_it(env: &Env) -> Result<()> {
    let name = "ktty-attach";
    let _alone = RESTART
        .write()
        .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    block_on(async {
        let pods = run_pod(env, name, &["sh"], true).await?;
        let result = async {
            let kubectl = attach_and_answer(env, name, 1000)?;
            // Detach by killing kubectl: the container goes on.
            drop(kubectl);
            // The agent restarts (SIGHUP re-executes it); the terminal stays with the
            // supervisor, and attach works again through the new agent.
            env.agent
                .signal_supervisor(nix::sys::signal::Signal::SIGHUP)?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut kubectl = attach_and_answer(env, name, 5000)?;
            kubectl.send("exit 7\r")?;
            let status = kubectl
                .wait(ANSWER)?
                .context("kubectl attach did not end")?;
            ensure!(status.code().is_some(), "kubectl attach: {status}");
            let code = eventually(
                "the attached container terminated",
                Duration::from_secs(30),
                || async {
                    let pod = pods.get(name).await?;
                    Ok(pod
                        .status
                        .and_then(|s| s.container_statuses)
                        .into_iter()
                        .flatten()
                        .find_map(|c| c.state?.terminated.map(|t| t.exit_code)))
                },
            )
            .await?;
            ensure!(code == 7, "exit code {code}");
            // Both sessions' output is in the log, across the restart.
            let logs = env.plane.kubectl(&["logs", name])?;
            ensure!(
                logs.contains("attached-10") && logs.contains("attached-50"),
                "kubectl logs: {logs:?}"
            );
            Ok(())
        }
        .await;
        remove_pod(&pods, name).await?;
        result
    })
}

fn run_it_rm(env: &Env) -> Result<()> {
    let name = "ktty-run";
    let _shared = RESTART
        .read()
        .map_err(|_| anyhow::anyhow!("lock poisoned"))?;
    let overrides = json!({ "spec": { "nodeName": env.agent.node_name } }).to_string();
    let mut kubectl = kubectl_on_pty(
        env,
        &[
            "run",
            name,
            "-it",
            "--rm",
            "--restart=Never",
            "--image=busybox",
            "--image-pull-policy=Never",
            "--overrides",
            &overrides,
            "--",
            "sh",
        ],
    )?;
    let result = (|| {
        kubectl.expect("If you don't see a command prompt", ANSWER)?;
        let mut seen = false;
        for i in 0..30 {
            kubectl.send(&format!("echo run-$(({i}+2000))\r"))?;
            if kubectl
                .expect(&format!("run-{}\r\n", i + 2000), Duration::from_secs(1))
                .is_ok()
            {
                seen = true;
                break;
            }
        }
        ensure!(seen, "no answer through kubectl run: {}", kubectl.seen());
        kubectl.send("exit\r")?;
        let status = kubectl.wait(ANSWER)?.context("kubectl run did not end")?;
        ensure!(
            status.success(),
            "kubectl run: {status}; {}",
            kubectl.seen()
        );
        kubectl.expect(&format!("pod \"{name}\" deleted"), ANSWER)?;
        Ok(())
    })();
    drop(kubectl);
    block_on(async {
        let client = env.plane.admin_client().await?;
        let pods: Api<Pod> = Api::namespaced(client, "default");
        remove_pod(&pods, name).await
    })?;
    result
}

//! The kubelet API of a real `ironlet run --kubeconfig` joined to a real control plane
//! (`scripts/controlplane`), driven by the real `kubectl` through the real kube-apiserver
//! (which reaches the node with its kubelet client certificate and verifies the node's
//! serving certificate): `kubectl logs` plain, `--tail`, `-f` until the container exits,
//! `--previous` after a restart; a follower that goes away leaves no reader behind;
//! `kubectl exec` (streams, exit code, stdin, `kubectl cp` both ways, a container that exits
//! under it, a client killed mid-exec leaves no process) through the WebSocket the API
//! server proxies to the node (`ExtendWebSocketsToKubelet`); `kubectl exec -i` over SPDY/3.1
//! (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`): stdin, stdout, stderr, exit code, and
//! `kubectl attach -i` over SPDY/3.1 to a container with `stdin` (no terminal): a line typed
//! reaches it, its stdout and stderr come back; a raw WebSocket exec through
//! `kubectl proxy` with the older `channel.k8s.io` and `base64.channel.k8s.io` (the
//! conformance spec's protocols): `cat /etc/resolv.conf` on channel 1, a failure's message
//! as text on channel 3, then the Close; and the node itself refuses requests without credentials (401), with a token whose user has no
//! RBAC for `nodes/proxy` (403, then allowed once it has), and with a client certificate
//! from another CA (handshake refused). The resource endpoints through the API server's node
//! proxy: `/stats/summary` shows a pod holding 40 MiB with at least that working set and a
//! busy container's CPU counter rising, and plausible node figures; `/metrics/resource` has
//! kubelet's metric names with the same figures; `/runningpods/` lists the pod; a pod's 5 MiB
//! written into its root file system and 3 MiB into an emptyDir show as its container's
//! `rootfs` and its `volume`, both in its `ephemeral-storage`. metrics-server
//! (built from its Go module, `scripts/metrics-server`) runs as a host process behind the
//! `v1beta1.metrics.k8s.io` APIService, and `kubectl top pod` / `kubectl top node` show the
//! pod's 40 MiB and the node. `/metrics/probes` counts a pod's readiness probe runs. The agent
//! starts with `--config`: `/configz` shows a value from the file and one a flag overrode.
//! Its `containerLogMaxSize: 1Mi` / `containerLogMaxFiles: 3` rotate the log of a pod that
//! writes 30000 numbered lines (~4 MiB): at most 3 files are left, their lines run on without
//! a gap or a repeat, `--tail` spans them, and a `kubectl logs -f` started before the
//! output sees every line once.
//! `kubectl port-forward` (SPDY tunnelled in the WebSocket the API server proxies to the
//! node) to a busybox `httpd`: a page, a 20 MiB file byte for byte (its MB/s printed), two
//! connections at once; a port nothing listens on gets kubelet's error through kubectl while
//! another session and the node go on; the node refuses port forwarding without credentials
//! (401) and without RBAC (403); a kubectl killed mid-connection leaves no connection open
//! in the pod; a host-network pod's port is reached on the host's loopback.
//!
//! One control plane and one agent (node `e2e-kapi-<pid>`) serve every test of this binary;
//! the tests use distinct pod names. Needs root (containers, cgroups, CNI).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_e2e::{
    block_on, eventually, routable_host_ip, run_suite, ClusterAgent, ControlPlane, SuiteTest,
};
use ironlet_runtime::testkit::processes_with_cmdline;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

struct Env {
    plane: ControlPlane,
    agent: ClusterAgent,
    /// The agent's `--config` file.
    config: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// `maxPods` of the agent's `--config` file.
const CONFIG_MAX_PODS: u64 = 77;
/// `containerLogMaxFiles` of the agent's `--config` file (with `containerLogMaxSize: 1Mi`).
const CONFIG_LOG_MAX_FILES: usize = 3;

const TESTS: &[SuiteTest<Env>] = &[
    (
        "kubectl_logs_reads_the_log_with_tail_and_follows_until_the_container_exits",
        logs_plain_tail_follow,
    ),
    (
        "kubectl_logs_previous_reads_the_instance_before_a_restart",
        logs_previous,
    ),
    (
        "a_follower_that_goes_away_leaves_no_reader_on_the_node",
        follower_disconnects,
    ),
    (
        "kubectl_exec_carries_stdout_stderr_and_the_exit_code",
        exec_streams_and_exit_code,
    ),
    ("kubectl_exec_i_feeds_stdin_until_it_closes", exec_stdin),
    (
        "kubectl_exec_over_spdy_carries_stdin_stdout_stderr_and_the_exit_code",
        exec_spdy,
    ),
    (
        "kubectl_attach_i_over_spdy_feeds_stdin_and_carries_stdout_and_stderr",
        attach_spdy,
    ),
    (
        "kubectl_cp_copies_a_file_into_and_out_of_the_pod_unchanged",
        cp_both_ways,
    ),
    (
        "twenty_concurrent_execs_each_get_their_own_output",
        exec_concurrent,
    ),
    (
        "an_exec_into_a_container_that_exits_ends_cleanly",
        exec_container_exits,
    ),
    (
        "a_killed_exec_client_leaves_no_process_in_the_container",
        exec_client_killed,
    ),
    (
        "exec_on_the_node_is_refused_without_credentials_401_and_without_rbac_403",
        exec_refused,
    ),
    (
        "exec_over_channel_k8s_io_and_base64_sends_stdout_on_channel_1_then_closes",
        exec_websocket_v1,
    ),
    (
        "the_node_refuses_no_credentials_401_a_token_without_rbac_403_and_allows_it_with_rbac",
        token_authn_authz,
    ),
    (
        "the_node_refuses_a_client_certificate_from_another_ca_and_accepts_the_apiservers",
        client_certificates,
    ),
    (
        "stats_summary_metrics_resource_and_runningpods_show_a_40mib_busy_pod",
        stats_endpoints,
    ),
    (
        "stats_summary_shows_a_pods_writes_in_its_rootfs_and_emptydir",
        stats_file_systems,
    ),
    (
        "kubectl_top_pod_and_node_through_metrics_server",
        kubectl_top,
    ),
    (
        "metrics_probes_counts_a_readiness_probe_until_the_pod_goes",
        metrics_probes,
    ),
    (
        "configz_shows_the_config_file_s_values_and_the_flags_that_override_them",
        configz,
    ),
    (
        "a_log_rotated_past_container_log_max_size_keeps_max_files_and_every_line_for_a_follower",
        logs_rotation,
    ),
    (
        "kubectl_port_forward_serves_a_page_20mib_unchanged_and_concurrent_connections",
        port_forward,
    ),
    (
        "kubectl_port_forward_to_a_closed_port_reports_kubelets_error_and_the_node_goes_on",
        port_forward_closed_port,
    ),
    (
        "port_forward_on_the_node_is_refused_without_credentials_401_and_without_rbac_403",
        port_forward_refused,
    ),
    (
        "a_killed_kubectl_port_forward_leaves_no_connection_in_the_pod",
        port_forward_client_killed,
    ),
    (
        "kubectl_port_forward_to_a_host_network_pod_reaches_the_hosts_loopback",
        port_forward_host_network,
    ),
];

const RUNNING_TIMEOUT: Duration = Duration::from_secs(60);

fn main() {
    run_suite("kubelet_api", TESTS, start, |env| {
        eprintln!("agent log tail:\n{}", env.agent.log_tail(60));
        eprintln!("control plane logs:\n{}", env.plane.log_tails(20));
    });
}

fn start() -> Result<Env> {
    let plane = ControlPlane::up()?;
    let node = format!("e2e-kapi-{}", std::process::id());
    let kubeconfig = plane.node_kubeconfig(&node)?;
    // staticPodPath is overridden by the --pod-manifest-path flag the agent is started with.
    let config = std::env::temp_dir().join(format!("kapi-config-{}.yaml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             maxPods: {CONFIG_MAX_PODS}\nstaticPodPath: /nonexistent/from-config\n\
             containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: {CONFIG_LOG_MAX_FILES}\n"
        ),
    )
    .context("writing the agent's config file")?;
    let extra = [std::ffi::OsStr::new("--config"), config.as_os_str()];
    // On the host's address: the API server's node proxy (`kubectl get --raw
    // /api/v1/nodes/NODE/proxy/…`) refuses a loopback node.
    let node_ip = routable_host_ip().context("no routable host address for the node")?;
    let slot = 100 + std::process::id() % 150;
    let agent = ClusterAgent::start_on(&kubeconfig, &node, slot, &extra, node_ip);
    match agent {
        Ok(agent) => Ok(Env {
            plane,
            agent,
            config,
        }),
        Err(err) => {
            let _ = std::fs::remove_file(&config);
            Err(err)
        }
    }
}

/// A busybox pod on the test node running `script` with `sh -c`.
async fn run_pod(env: &Env, name: &str, script: &str, restart: &str) -> Result<Api<Pod>> {
    run_pod_with(env, name, script, restart, false).await
}

/// [`run_pod`], in the host's network namespace if `host_network`.
async fn run_pod_with(
    env: &Env,
    name: &str,
    script: &str,
    restart: &str,
    host_network: bool,
) -> Result<Api<Pod>> {
    let pods = create_pod(
        env,
        json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "hostNetwork": host_network,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
        }),
    )
    .await?;
    wait_running(&pods, name, 0).await?;
    Ok(pods)
}

/// Creates `pod` in `default` (retrying while the fresh control plane cannot take it yet);
/// the API of the namespace's pods.
async fn create_pod(env: &Env, pod: serde_json::Value) -> Result<Api<Pod>> {
    let client = env.plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(pod)?;
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), &pod).await?;
        Ok(Some(()))
    })
    .await?;
    Ok(pods)
}

/// Waits until the pod's container runs after at least `restarts` restarts.
async fn wait_running(pods: &Api<Pod>, name: &str, restarts: i32) -> Result<()> {
    let what = format!("pod {name} running after {restarts} restarts");
    eventually(&what, RUNNING_TIMEOUT, || async {
        let pod = pods.get(name).await?;
        let running = pod
            .status
            .and_then(|s| s.container_statuses)
            .into_iter()
            .flatten()
            .any(|c| c.restart_count >= restarts && c.state.is_some_and(|s| s.running.is_some()));
        Ok(running.then_some(()))
    })
    .await
}

/// Runs `body` against a running pod `name` (`sh -c script`), then removes the pod whatever
/// `body` returned.
fn with_pod<F, Fut>(env: &Env, name: &str, script: &str, restart: &str, body: F) -> Result<()>
where
    F: FnOnce(Api<Pod>) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    block_on(async {
        let pods = run_pod(env, name, script, restart).await?;
        let result = body(pods.clone()).await;
        remove_pod(&pods, name).await?;
        result
    })
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

/// Runs `kubectl logs` with `args` until its output contains `want` (the container may not
/// have written it yet); returns that output.
fn logs_until(env: &Env, args: &[&str], want: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = env.plane.kubectl(args);
        match out {
            Ok(text) if text.contains(want) => return Ok(text),
            other if Instant::now() >= deadline => {
                bail!(
                    "kubectl {} never showed {want:?}: {other:?}",
                    args.join(" ")
                )
            }
            _ => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

fn logs_plain_tail_follow(env: &Env) -> Result<()> {
    let name = "kapi-logs";
    with_pod(
        env,
        name,
        "for i in 1 2 3; do echo line-$i; done; sleep 1; echo to-stderr >&2; sleep 4; echo late-line",
        "Never",
        |_pods| async move {
            let all = logs_until(env, &["logs", name], "to-stderr")?;
            assert_eq!(all, "line-1\nline-2\nline-3\nto-stderr\n");
            let tail = env.plane.kubectl(&["logs", name, "--tail=2"])?;
            assert_eq!(tail, "line-3\nto-stderr\n");
            let stamped = env
                .plane
                .kubectl(&["logs", name, "--tail=1", "--timestamps"])?;
            assert!(
                stamped.ends_with("Z to-stderr\n") && stamped.starts_with("20"),
                "{stamped:?}"
            );
            // -f while the container runs: ends by itself once it exits, with everything.
            let started = Instant::now();
            let follow = env
                .plane
                .kubectl_command()
                .args(["logs", "-f", name])
                .output()
                .context("running kubectl logs -f")?;
            assert!(follow.status.success(), "{follow:?}");
            let text = String::from_utf8_lossy(&follow.stdout);
            assert!(text.ends_with("to-stderr\nlate-line\n"), "{text:?}");
            assert!(started.elapsed() < Duration::from_secs(30));
            Ok(())
        },
    )
}

fn logs_previous(env: &Env) -> Result<()> {
    let name = "kapi-previous";
    with_pod(
        env,
        name,
        "echo instance-$(cat /proc/sys/kernel/random/uuid); sleep 2; exit 1",
        "Always",
        |pods| async move {
            wait_running(&pods, name, 1).await?;
            let current = logs_until(env, &["logs", name], "instance-")?;
            let previous = env.plane.kubectl(&["logs", name, "--previous"])?;
            assert!(previous.starts_with("instance-"), "{previous:?}");
            assert_ne!(previous, current, "--previous must be the earlier instance");
            Ok(())
        },
    )
}

/// Open file descriptors of every process on the host that point at `path`.
fn open_fds(path: &Path) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter_map(|p| std::fs::read_dir(p.path().join("fd")).ok())
        .flat_map(|fds| fds.flatten())
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
        .count()
}

fn log_file(env: &Env, pod: &Pod) -> Result<PathBuf> {
    let uid = pod.metadata.uid.clone().context("pod uid")?;
    let name = pod.metadata.name.clone().context("pod name")?;
    let dir = env
        .agent
        .root
        .join("logs")
        .join(format!("default_{name}_{uid}"))
        .join("main");
    Ok(dir.join("0.log"))
}

fn follower_disconnects(env: &Env) -> Result<()> {
    let name = "kapi-follower";
    with_pod(
        env,
        name,
        "echo first; exec sleep 3600",
        "Never",
        |pods| async move {
            let pod = pods.get(name).await?;
            let file = log_file(env, &pod)?;
            logs_until(env, &["logs", name], "first")?;
            let baseline = open_fds(&file);
            let mut follower = env
                .plane
                .kubectl_command()
                .args(["logs", "-f", name])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting kubectl logs -f")?;
            let reading = eventually(
                "the node reads the log for the follower",
                Duration::from_secs(20),
                || async { Ok((open_fds(&file) > baseline).then_some(())) },
            )
            .await;
            let _ = follower.kill();
            let _ = follower.wait();
            reading?;
            eventually(
                "the node's reader is gone",
                Duration::from_secs(10),
                || async { Ok((open_fds(&file) == baseline).then_some(())) },
            )
            .await?;
            Ok(())
        },
    )
}

/// The numbers of the lines `text` holds (`<n> <padding>`), in order.
fn line_numbers(text: &str) -> Result<Vec<u32>> {
    text.lines()
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("not a numbered line: {l:?}"))
        })
        .collect()
}

fn logs_rotation(env: &Env) -> Result<()> {
    let name = "kapi-rotation";
    const LINES: u32 = 30000;
    // ~140 bytes a record, in five bursts a second apart (rotated names have a second's
    // resolution): about four 1Mi rotations. The follower starts during the first sleep.
    let script = "sleep 4; pad=$(printf '%090d' 0); i=1; \
                  for b in 1 2 3 4 5; do end=$((b*6000)); \
                  while [ $i -le $end ]; do echo \"$i $pad\"; i=$((i+1)); done; sleep 1; done";
    with_pod(env, name, script, "Never", |pods| async move {
        let pod = pods.get(name).await?;
        let dir = log_file(env, &pod)?
            .parent()
            .context("container log dir")?
            .to_owned();
        let follower = env
            .plane
            .kubectl_command()
            .args(["logs", "-f", name])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl logs -f")?;
        let followed = follower
            .wait_with_output()
            .context("waiting for kubectl logs -f")?;
        assert!(followed.status.success(), "{followed:?}");
        let seen = line_numbers(&String::from_utf8_lossy(&followed.stdout))?;
        let all: Vec<u32> = (1..=LINES).collect();
        assert!(
            seen == all,
            "the follower saw {} lines, first {:?}, last {:?}",
            seen.len(),
            seen.first(),
            seen.last()
        );
        // The files: at most max-files, rotated ones named <n>.log.<YYYYMMDD-HHMMSS>.
        let mut names: Vec<String> = std::fs::read_dir(&dir)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort_by_key(|n| (n == "0.log", n.clone()));
        assert!(
            (2..=CONFIG_LOG_MAX_FILES).contains(&names.len()),
            "{names:?}"
        );
        assert_eq!(names.last().map(String::as_str), Some("0.log"));
        for rotated in &names[..names.len() - 1] {
            let suffix = rotated.strip_prefix("0.log.").unwrap_or_default();
            assert!(
                suffix.len() == 15 && suffix.as_bytes()[8] == b'-',
                "{rotated}"
            );
        }
        // What the files hold, oldest first: a run of lines ending with the last one.
        let mut kept = Vec::new();
        for file in &names {
            let text = std::fs::read_to_string(dir.join(file))?;
            for record in text.lines() {
                let content = record.splitn(4, ' ').nth(3).unwrap_or_default();
                kept.push(line_numbers(content)?.first().copied().unwrap_or(0));
            }
        }
        let first = kept.first().copied().unwrap_or(0);
        eprintln!("rotation: files {names:?}, first line kept {first}");
        assert!(first > 1, "older rotated files were removed");
        assert!(
            kept == (first..=LINES).collect::<Vec<_>>(),
            "the files' lines are not consecutive from {first} to {LINES}"
        );
        // kubectl logs reads them in the same order; --tail spans files.
        let plain = line_numbers(&env.plane.kubectl(&["logs", name])?)?;
        assert!(plain == kept, "kubectl logs differs from the files");
        let tail_n = usize::try_from(LINES - first).unwrap_or(0) - 10;
        let tail =
            line_numbers(
                &env.plane
                    .kubectl(&["logs", name, &format!("--tail={tail_n}")])?,
            )?;
        assert!(
            tail == kept[kept.len() - tail_n..],
            "--tail={tail_n} does not span the rotated files"
        );
        Ok(())
    })
}

/// The kubelet API port the Node reports.
fn node_port(env: &Env) -> Result<u16> {
    block_on(async {
        let nodes: Api<Node> = Api::all(env.plane.admin_client().await?);
        eventually(
            "the node reports its kubelet port",
            RUNNING_TIMEOUT,
            || async {
                let node = nodes.get_opt(&env.agent.node_name).await?;
                let port = node
                    .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint)
                    .map(|e| e.port)
                    .filter(|p| *p > 0);
                Ok(port.and_then(|p| u16::try_from(p).ok()))
            },
        )
        .await
    })
}

/// `curl` to the node; the HTTP status (`000` when the connection or handshake failed).
fn curl(env: &Env, port: u16, path: &str, extra: &[&str]) -> Result<String> {
    let ca = env.plane.dir().join("pki/ca.crt");
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .arg("--cacert")
        .arg(ca)
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .context("running curl")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn token_authn_authz(env: &Env) -> Result<()> {
    let port = node_port(env)?;
    let path = "/pods";
    assert_eq!(curl(env, port, path, &[])?, "401", "no credentials");
    assert_eq!(
        curl(
            env,
            port,
            path,
            &["-H", "Authorization: Bearer not-a-token"]
        )?,
        "401",
        "a token the API server rejects"
    );
    let sa = "kapi-reader";
    env.plane.kubectl(&["create", "serviceaccount", sa])?;
    let token = env.plane.kubectl(&["create", "token", sa])?;
    let header = format!("Authorization: Bearer {}", token.trim());
    let result = (|| {
        assert_eq!(curl(env, port, path, &["-H", &header])?, "403", "no RBAC");
        env.plane.kubectl(&[
            "create",
            "clusterrole",
            "kapi-node-proxy",
            "--verb=get",
            "--resource=nodes/proxy",
        ])?;
        env.plane.kubectl(&[
            "create",
            "clusterrolebinding",
            "kapi-node-proxy",
            "--clusterrole=kapi-node-proxy",
            &format!("--serviceaccount=default:{sa}"),
        ])?;
        // kubelet caches a denial for 30 s: allowed within that and a margin.
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            let code = curl(env, port, path, &["-H", &header])?;
            if code == "200" {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("still {code} with RBAC for nodes/proxy");
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })();
    let _ = env
        .plane
        .kubectl(&["delete", "clusterrolebinding", "kapi-node-proxy"]);
    let _ = env
        .plane
        .kubectl(&["delete", "clusterrole", "kapi-node-proxy"]);
    let _ = env.plane.kubectl(&["delete", "serviceaccount", sa]);
    result
}

fn client_certificates(env: &Env) -> Result<()> {
    let port = node_port(env)?;
    let dir = tempdir()?;
    let openssl = |args: &[&str]| -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()?;
        if !out.status.success() {
            bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    // Another CA, and a client certificate it signed with the apiserver's identity.
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "other-ca.key",
        "-out",
        "other-ca.crt",
        "-subj",
        "/CN=other-ca",
        "-days",
        "1",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "other-ca.crt",
        "-CAkey",
        "other-ca.key",
        "-set_serial",
        "7",
        "-days",
        "1",
        "-out",
        "client.crt",
    ])?;
    let result = (|| {
        let cert = dir.join("client.crt");
        let key = dir.join("client.key");
        let other = curl(
            env,
            port,
            "/pods",
            &[
                "--cert",
                &cert.to_string_lossy(),
                "--key",
                &key.to_string_lossy(),
            ],
        )?;
        assert_eq!(
            other, "000",
            "a certificate from another CA must be refused"
        );
        let pki = env.plane.dir().join("pki");
        let good = curl(
            env,
            port,
            "/pods",
            &[
                "--cert",
                &pki.join("apiserver-kubelet-client.crt").to_string_lossy(),
                "--key",
                &pki.join("apiserver-kubelet-client.key").to_string_lossy(),
            ],
        )?;
        assert_eq!(good, "200", "the apiserver's kubelet client certificate");
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A pod that only sleeps, for execs.
const SLEEPER: &str = "exec sleep 3600";

/// `kubectl` with `args` run to its end with `stdin` fed to it; its output and exit code.
fn kubectl_with_stdin(env: &Env, args: &[&str], stdin: &[u8]) -> Result<std::process::Output> {
    kubectl_with_stdin_env(env, &[], args, stdin)
}

/// [`kubectl_with_stdin`] with environment variables set for kubectl.
fn kubectl_with_stdin_env(
    env: &Env,
    vars: &[(&str, &str)],
    args: &[&str],
    stdin: &[u8],
) -> Result<std::process::Output> {
    let mut child = env
        .plane
        .kubectl_command()
        .envs(vars.iter().copied())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting kubectl {}", args.join(" ")))?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin).context("writing kubectl's stdin")?;
    }
    child.wait_with_output().context("waiting for kubectl")
}

/// `kubectl exec POD -- sh -c SCRIPT` started, its stdout and stderr to `output`.
fn spawn_exec_sh(
    env: &Env,
    pod: &str,
    script: &str,
    output: fn() -> Stdio,
) -> Result<std::process::Child> {
    env.plane
        .kubectl_command()
        .args(["exec", pod, "--", "sh", "-c", script])
        .stdout(output())
        .stderr(output())
        .spawn()
        .context("starting kubectl exec")
}

/// `kubectl exec POD -- sh -c SCRIPT` run to its end.
fn kubectl_exec_sh(env: &Env, pod: &str, script: &str) -> Result<std::process::Output> {
    kubectl_with_stdin(env, &["exec", pod, "--", "sh", "-c", script], b"")
}

fn exec_streams_and_exit_code(env: &Env) -> Result<()> {
    let name = "kapi-exec";
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        let out = kubectl_exec_sh(env, name, "echo out; echo err >&2; exit 3")?;
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("err\n"), "{stderr:?}");
        // Success, and output larger than one pipe buffer and one frame arrives whole.
        let big = env.plane.kubectl(&[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "head -c 3000000 /dev/zero | tr '\\0' x",
        ])?;
        assert_eq!(big.len(), 3_000_000);
        assert!(big.bytes().all(|b| b == b'x'));
        Ok(())
    })
}

/// kubectl made to speak SPDY/3.1 (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`, as kubectl
/// before 1.31 does): the API server proxies the SPDY upgrade to the node unchanged.
fn exec_spdy(env: &Env) -> Result<()> {
    let name = "kapi-exec-spdy";
    let spdy = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")];
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        let script = "cat; echo err >&2; exit 3";
        let args = ["exec", "-i", name, "--", "sh", "-c", script];
        let out = kubectl_with_stdin_env(env, &spdy, &args, b"through spdy\n")?;
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "through spdy\n");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("err\n"), "{stderr:?}");
        // Success, and output of many frames arrives whole.
        let args = [
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "head -c 3000000 /dev/zero | tr '\\0' x",
        ];
        let big = kubectl_with_stdin_env(env, &spdy, &args, b"")?;
        assert!(
            big.status.success(),
            "{:?}",
            String::from_utf8_lossy(&big.stderr)
        );
        assert_eq!(big.stdout.len(), 3_000_000);
        assert!(big.stdout.iter().all(|b| *b == b'x'));
        Ok(())
    })
}

/// `kubectl attach -i` made to speak SPDY/3.1 (as for [`exec_spdy`]) to a container started
/// with `stdin` and no terminal, which waits for a line: the line kubectl is fed reaches it,
/// and what it then prints on stdout and stderr comes back until it exits.
fn attach_spdy(env: &Env) -> Result<()> {
    let name = "kapi-attach-spdy";
    block_on(async {
        let pods = create_pod(
            env,
            json!({
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
                        "stdin": true,
                        "command": ["sh", "-c",
                            "read line; echo \"out:$line\"; echo \"err:$line\" >&2; sleep 1; exit 4"],
                    }],
                },
            }),
        )
        .await?;
        let result = async {
            wait_running(&pods, name, 0).await?;
            let spdy = [("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")];
            let args = ["attach", "-i", name, "-c", "main"];
            let out = kubectl_with_stdin_env(env, &spdy, &args, b"typed-through-spdy\n")?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            ensure!(
                stdout.contains("out:typed-through-spdy\n"),
                "stdout {stdout:?}, stderr {stderr:?}"
            );
            ensure!(
                stderr.contains("err:typed-through-spdy\n"),
                "stdout {stdout:?}, stderr {stderr:?}"
            );
            // The container ended with its own code (attach ends with it).
            let code = eventually("the container terminated", RUNNING_TIMEOUT, || async {
                let pod = pods.get(name).await?;
                Ok(pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .into_iter()
                    .flatten()
                    .find_map(|c| c.state?.terminated.map(|t| t.exit_code)))
            })
            .await?;
            ensure!(code == 4, "exit code {code}");
            Ok(())
        }
        .await;
        remove_pod(&pods, name).await?;
        result
    })
}

fn exec_stdin(env: &Env) -> Result<()> {
    let name = "kapi-exec-stdin";
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        let out = kubectl_with_stdin(env, &["exec", "-i", name, "--", "cat"], b"hi\n")?;
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
        // The process sees end-of-file: `wc -c` ends and counts every byte.
        let input = vec![b'y'; 200_000];
        let out = kubectl_with_stdin(env, &["exec", "-i", name, "--", "wc", "-c"], &input)?;
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "200000");
        Ok(())
    })
}

fn cp_both_ways(env: &Env) -> Result<()> {
    let name = "kapi-cp";
    let dir = std::env::temp_dir().join(format!("kapi-cp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context("creating the cp dir")?;
    let result = with_pod(env, name, SLEEPER, "Never", |_pods| {
        let dir = dir.clone();
        async move {
            // 1 MiB that no compression or line ending change leaves alone.
            let mut content = Vec::with_capacity(1 << 20);
            let mut x: u32 = 2_463_534_242;
            while content.len() < 1 << 20 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                content.extend_from_slice(&x.to_le_bytes());
            }
            let local = dir.join("in.bin");
            std::fs::write(&local, &content).context("writing the local file")?;
            let local_arg = local.to_string_lossy().into_owned();
            env.plane
                .kubectl(&["cp", &local_arg, &format!("{name}:/tmp/copied.bin")])?;
            let size = env
                .plane
                .kubectl(&["exec", name, "--", "wc", "-c", "/tmp/copied.bin"])?;
            assert!(size.starts_with("1048576 "), "{size:?}");
            let back = dir.join("out.bin");
            let back_arg = back.to_string_lossy().into_owned();
            env.plane
                .kubectl(&["cp", &format!("{name}:/tmp/copied.bin"), &back_arg])?;
            let returned = std::fs::read(&back).context("reading the copied-back file")?;
            assert!(returned == content, "the round trip changed the file");
            Ok(())
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn exec_concurrent(env: &Env) -> Result<()> {
    let name = "kapi-exec-many";
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        // One exec alone first: its round trip, for the record.
        let mut rounds = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let out = kubectl_exec_sh(env, name, "true")?;
            assert!(out.status.success(), "{out:?}");
            rounds.push(started.elapsed());
        }
        rounds.sort();
        eprintln!("kubectl exec -- true round trip: median {:?}", rounds[2]);
        let children: Vec<_> = (0..20)
            .map(|i| spawn_exec_sh(env, name, &format!("sleep 1; echo exec-{i}"), Stdio::piped))
            .collect::<Result<_>>()?;
        for (i, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().context("waiting for kubectl")?;
            assert!(out.status.success(), "exec {i}: {out:?}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), format!("exec-{i}\n"));
        }
        Ok(())
    })
}

fn exec_container_exits(env: &Env) -> Result<()> {
    let name = "kapi-exec-exits";
    with_pod(env, name, "sleep 10", "Never", |_pods| async move {
        let started = Instant::now();
        let out = kubectl_exec_sh(env, name, "echo started; exec sleep 600")?;
        // The container's end kills the exec'd process (SIGKILL: 137), and the exec ends.
        assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n", "{out:?}");
        assert!(!out.status.success(), "{out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "took {:?}",
            started.elapsed()
        );
        Ok(())
    })
}

fn exec_client_killed(env: &Env) -> Result<()> {
    let name = "kapi-exec-killed";
    // A marker no other process on the host runs.
    let seconds = format!("{}", 1000 + std::process::id() % 1000);
    with_pod(env, name, SLEEPER, "Never", |_pods| {
        let seconds = seconds.clone();
        async move {
            let script = format!("sleep {seconds}; true");
            let mut client = spawn_exec_sh(env, name, &script, Stdio::null)?;
            let running = eventually(
                "the exec'd sleep runs in the container",
                Duration::from_secs(30),
                || async {
                    Ok((!processes_with_cmdline(&["sleep", &seconds]).is_empty()).then_some(()))
                },
            )
            .await;
            let _ = client.kill();
            let _ = client.wait();
            running?;
            eventually(
                "the exec'd processes are gone",
                Duration::from_secs(15),
                || async {
                    let left = processes_with_cmdline(&["sleep", &seconds]).is_empty()
                        && processes_with_cmdline(&["sh", "-c", &script]).is_empty();
                    Ok(left.then_some(()))
                },
            )
            .await
        }
    })
}

fn exec_refused(env: &Env) -> Result<()> {
    let name = "kapi-exec-refused";
    let path = format!("/exec/default/{name}/main?command=true&stdout=1");
    refused_401_403(env, name, &path, "v5.channel.k8s.io", "kapi-exec-nobody")
}

/// `kubectl proxy` on a free loopback port, exec and attach allowed (its default refuses
/// them); killed on drop.
struct KubectlProxy {
    child: std::process::Child,
    port: u16,
}

impl KubectlProxy {
    fn start(env: &Env) -> Result<Self> {
        let child = env
            .plane
            .kubectl_command()
            .args(["proxy", "--port=0", "--reject-paths=^$"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kubectl proxy")?;
        let mut proxy = Self { child, port: 0 };
        let stdout = proxy
            .child
            .stdout
            .take()
            .context("kubectl proxy's stdout")?;
        // "Starting to serve on 127.0.0.1:PORT"
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        proxy.port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("kubectl proxy said {line:?}"))?;
        Ok(proxy)
    }
}

impl Drop for KubectlProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The messages of an exec of `command` in `pod`'s container `main` over a WebSocket
/// offering only `protocol`, through `kubectl proxy` and the API server, as (channel,
/// data) with the base64 codec decoded; and whether the server ended with a Close frame.
async fn websocket_exec(
    port: u16,
    pod: &str,
    protocol: &str,
    command: &[&str],
) -> Result<(Vec<(u8, Vec<u8>)>, bool)> {
    use base64::Engine;
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    use tokio_tungstenite::tungstenite::Message;

    let mut query = String::from("container=main&stdout=1&stderr=1");
    for word in command {
        query.push_str("&command=");
        for byte in word.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
                query.push(char::from(byte));
            } else {
                query.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    let url = format!("ws://127.0.0.1:{port}/api/v1/namespaces/default/pods/{pod}/exec?{query}");
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(protocol)?);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut ws, response) = tokio_tungstenite::client_async(request, tcp)
        .await
        .with_context(|| format!("WebSocket exec with {protocol}"))?;
    let chosen = response.headers().get("Sec-WebSocket-Protocol");
    assert_eq!(chosen.and_then(|v| v.to_str().ok()), Some(protocol));
    let base64 = protocol.contains("base64");
    let mut messages = Vec::new();
    let mut closed = false;
    let read = async {
        while let Some(message) = ws.next().await {
            let data: Vec<u8> = match message? {
                Message::Binary(data) if !base64 => data.into(),
                Message::Text(text) if base64 => {
                    let (digit, encoded) = text.split_at(1);
                    let mut data = vec![digit.as_bytes()[0].wrapping_sub(b'0')];
                    base64::engine::general_purpose::STANDARD.decode_vec(encoded, &mut data)?;
                    data
                }
                Message::Close(_) => {
                    closed = true;
                    break;
                }
                other => bail!("unexpected message {other:?} with {protocol}"),
            };
            if let Some((&channel, rest)) = data.split_first() {
                messages.push((channel, rest.to_vec()));
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .context("the exec did not end")??;
    Ok((messages, closed))
}

/// The conformance spec "Pods should support remote command execution over websockets":
/// `channel.k8s.io` forwarded by the API server to the node unchanged.
fn exec_websocket_v1(env: &Env) -> Result<()> {
    let name = "kapi-exec-v1";
    let proxy = KubectlProxy::start(env)?;
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        let want = kubectl_with_stdin(env, &["exec", name, "--", "cat", "/etc/resolv.conf"], b"")?;
        assert!(want.status.success(), "{want:?}");
        assert!(String::from_utf8_lossy(&want.stdout).contains("nameserver"));
        for protocol in ["channel.k8s.io", "base64.channel.k8s.io"] {
            let cat = ["cat", "/etc/resolv.conf"];
            let (messages, closed) = websocket_exec(proxy.port, name, protocol, &cat).await?;
            assert!(closed, "{protocol}: the server closes the connection");
            let channels: Vec<u8> = messages.iter().map(|(c, _)| *c).collect();
            assert!(channels.iter().all(|&c| c == 1), "{protocol}: {messages:?}");
            let stdout: Vec<u8> = messages.iter().flat_map(|(_, d)| d.clone()).collect();
            assert_eq!(stdout, want.stdout, "{protocol}: stdout");
            // v1 has no status JSON: a failure is its message as text on channel 3.
            let fail = ["sh", "-c", "echo bye >&2; exit 3"];
            let (messages, closed) = websocket_exec(proxy.port, name, protocol, &fail).await?;
            assert!(closed, "{protocol}: the server closes the connection");
            let status = "command terminated with non-zero exit code: exit status 3";
            assert!(
                messages.contains(&(2, b"bye\n".to_vec())),
                "{protocol}: {messages:?}"
            );
            assert_eq!(
                messages.last(),
                Some(&(3, status.as_bytes().to_vec())),
                "{protocol}"
            );
        }
        Ok(())
    })
}

/// A WebSocket upgrade of `path` (offering `protocol`) straight to the node, for a pod
/// `name`: 401 without credentials, 403 with the token of a new ServiceAccount `sa` that
/// has no RBAC for `nodes/proxy`.
fn refused_401_403(env: &Env, name: &str, path: &str, protocol: &str, sa: &str) -> Result<()> {
    let port = node_port(env)?;
    with_pod(env, name, SLEEPER, "Never", |_pods| async move {
        let protocol = format!("Sec-WebSocket-Protocol: {protocol}");
        let upgrade = [
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: websocket",
            "-H",
            "Sec-WebSocket-Version: 13",
            "-H",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "-H",
            &protocol,
        ];
        assert_eq!(curl(env, port, path, &upgrade)?, "401", "no credentials");
        env.plane.kubectl(&["create", "serviceaccount", sa])?;
        let result = (|| {
            let token = env.plane.kubectl(&["create", "token", sa])?;
            let header = format!("Authorization: Bearer {}", token.trim());
            let mut args = upgrade.to_vec();
            args.extend(["-H", &header]);
            assert_eq!(
                curl(env, port, path, &args)?,
                "403",
                "no RBAC for nodes/proxy"
            );
            Ok(())
        })();
        let _ = env.plane.kubectl(&["delete", "serviceaccount", sa]);
        result
    })
}

fn configz(env: &Env) -> Result<()> {
    let port = node_port(env)?;
    let pki = env.plane.dir().join("pki");
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("apiserver-kubelet-client.crt"))
        .arg("--key")
        .arg(pki.join("apiserver-kubelet-client.key"))
        .arg(format!("https://127.0.0.1:{port}/configz"))
        .output()
        .context("running curl")?;
    if !out.status.success() {
        bail!("GET /configz: {}", String::from_utf8_lossy(&out.stderr));
    }
    let body: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("/configz is not JSON")?;
    let config = &body["kubeletconfig"];
    assert_eq!(config["kind"], "KubeletConfiguration", "{body}");
    assert_eq!(
        config["apiVersion"], "kubelet.config.k8s.io/v1beta1",
        "{body}"
    );
    assert_eq!(config["maxPods"], CONFIG_MAX_PODS, "from the file: {body}");
    assert_eq!(
        config["staticPodPath"],
        env.agent.manifests.display().to_string(),
        "the flag overrides the file: {body}"
    );
    assert_eq!(config["port"], port, "{body}");
    // The file's maxPods is the Node's pod capacity too.
    let capacity = block_on(async {
        let nodes: Api<Node> = Api::all(env.plane.admin_client().await?);
        let node = nodes.get(&env.agent.node_name).await?;
        Ok(node
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("pods").map(|q| q.0.clone())))
    })?;
    assert_eq!(capacity.as_deref(), Some("77"));
    Ok(())
}

fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kapi-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context("creating the cert dir")?;
    Ok(dir)
}

const MIB: u64 = 1 << 20;

/// A container holding 40 MiB and spinning: tail keeps the one 40 MiB "line" in anonymous
/// memory while the sleep keeps its input open; the shell spins meanwhile.
const BUSY_40MIB: &str = "{ head -c 41943040 /dev/zero; sleep 3600; } | tail & while :; do :; done";

/// `kubectl get --raw` of a node path through the API server's node proxy.
fn node_proxy(env: &Env, path: &str) -> Result<String> {
    let url = format!("/api/v1/nodes/{}/proxy{path}", env.agent.node_name);
    env.plane.kubectl(&["get", "--raw", &url])
}

fn summary(env: &Env) -> Result<serde_json::Value> {
    let text = node_proxy(env, "/stats/summary")?;
    serde_json::from_str(&text).with_context(|| format!("parsing the summary {text:?}"))
}

/// The summary entry of pod `name` in `default`, if listed.
fn pod_entry<'a>(summary: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name && p["podRef"]["namespace"] == "default")
}

/// The value of the sample `series` (name and labels exactly) in a Prometheus text, and its
/// timestamp.
fn sample(text: &str, series: &str) -> Option<(f64, Option<i64>)> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        let mut fields = rest.split(' ');
        let value = fields.next()?.parse().ok()?;
        Some((value, fields.next().and_then(|t| t.parse().ok())))
    })
}

fn mem_total() -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("MemTotal")?;
    Ok(kib * 1024)
}

fn stats_endpoints(env: &Env) -> Result<()> {
    let name = "kapi-stats";
    with_pod(env, name, BUSY_40MIB, "Never", |_pods| async move {
        // The allocation takes a moment: wait until the container's working set shows it.
        let first = eventually(
            "the pod's 40 MiB in /stats/summary",
            Duration::from_secs(45),
            || async {
                let summary = summary(env)?;
                let ws = pod_entry(&summary, name)
                    .and_then(|p| p["containers"][0]["memory"]["workingSetBytes"].as_u64());
                Ok(ws.filter(|ws| *ws >= 40 * MIB).map(|_| summary))
            },
        )
        .await?;
        let pod = pod_entry(&first, name).context("pod entry")?;
        let container = &pod["containers"][0];
        assert_eq!(container["name"], "main");
        assert!(container["startTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')));
        assert!(
            pod["memory"]["workingSetBytes"].as_u64()
                >= container["memory"]["workingSetBytes"].as_u64()
        );
        // Most of it is anonymous memory (tail may still be filling its buffer's last pages).
        assert!(
            container["memory"]["rssBytes"].as_u64().unwrap_or(0) >= 32 * MIB,
            "{container}"
        );
        assert!(
            container["logs"]["capacityBytes"].as_u64().unwrap_or(0) > 0,
            "{container}"
        );
        assert!(
            pod["process_stats"]["process_count"].as_u64().unwrap_or(0) >= 3,
            "{pod}"
        );
        assert!(
            pod["network"]["interfaces"]
                .as_array()
                .is_some_and(|i| !i.is_empty()),
            "{pod}"
        );
        let cpu0 = container["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .context("container cpu")?;

        let node = &first["node"];
        let total = mem_total()?;
        assert_eq!(node["nodeName"], env.agent.node_name.as_str());
        let node_ws = node["memory"]["workingSetBytes"]
            .as_u64()
            .context("node ws")?;
        assert!(node_ws >= 40 * MIB && node_ws <= total, "{node}");
        assert!(node["memory"]["availableBytes"]
            .as_u64()
            .is_some_and(|a| a > 0 && a <= total));
        let node_cpu0 = node["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .context("node cpu")?;
        assert!(node["fs"]["capacityBytes"].as_u64() > node["fs"]["availableBytes"].as_u64());
        assert!(node["rlimit"]["maxpid"].as_u64().unwrap_or(0) > 0, "{node}");

        // The busy shell's CPU counter rises (and with it the node's).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let second = summary(env)?;
        let pod = pod_entry(&second, name).context("pod entry")?;
        let cpu1 = pod["containers"][0]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .context("cpu")?;
        assert!(
            cpu1 >= cpu0 + 200_000_000,
            "{cpu0} → {cpu1}: a spinning shell used < 0.2 s in 2 s"
        );
        assert!(
            pod["containers"][0]["cpu"]["usageNanoCores"]
                .as_u64()
                .unwrap_or(0)
                > 0
        );
        let node_cpu1 = second["node"]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .context("node cpu")?;
        assert!(
            node_cpu1 >= node_cpu0 + (cpu1 - cpu0) / 2,
            "node {node_cpu0} → {node_cpu1}"
        );

        // /metrics/resource: kubelet's names and labels, the same figures, timestamps in ms.
        let text = node_proxy(env, "/metrics/resource")?;
        let labels = format!("{{container=\"main\",namespace=\"default\",pod=\"{name}\"}}");
        let (ws, at) = sample(
            &text,
            &format!("container_memory_working_set_bytes{labels}"),
        )
        .with_context(|| format!("no container working set in {text}"))?;
        assert!(ws >= (40 * MIB) as f64, "{ws}");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        assert!(
            at.is_some_and(|t| (now_ms - t).abs() < 60_000),
            "timestamp {at:?}"
        );
        let (cpu, _) = sample(&text, &format!("container_cpu_usage_seconds_total{labels}"))
            .context("container cpu")?;
        assert!(cpu >= cpu1 as f64 / 1e9, "{cpu} s");
        let (started, _) = sample(&text, &format!("container_start_time_seconds{labels}"))
            .context("start time")?;
        assert!((now_ms as f64 / 1000.0 - started) < 600.0, "{started}");
        let pod_labels = format!("{{namespace=\"default\",pod=\"{name}\"}}");
        for series in [
            format!("pod_cpu_usage_seconds_total{pod_labels}"),
            format!("pod_memory_working_set_bytes{pod_labels}"),
            "node_cpu_usage_seconds_total".to_owned(),
            "node_memory_working_set_bytes".to_owned(),
        ] {
            let (value, at) =
                sample(&text, &series).with_context(|| format!("{series} in {text}"))?;
            assert!(value > 0.0 && at.is_some(), "{series} {value}");
        }
        assert_eq!(sample(&text, "scrape_error"), Some((0.0, None)));
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));

        // /runningpods/: a PodList with the pod and its running container.
        let running: serde_json::Value = serde_json::from_str(&node_proxy(env, "/runningpods/")?)?;
        assert_eq!(running["kind"], "PodList");
        let listed = running["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["metadata"]["name"] == name && p["metadata"]["namespace"] == "default");
        let listed = listed.with_context(|| format!("{name} not in {running}"))?;
        assert_eq!(listed["spec"]["containers"][0]["name"], "main");
        assert!(listed["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()));
        Ok(())
    })
}

/// The `usedBytes` and `inodesUsed` of a Summary `FsStats`.
fn fs_used(fs: &serde_json::Value) -> Option<(u64, u64)> {
    Some((fs["usedBytes"].as_u64()?, fs["inodesUsed"].as_u64()?))
}

/// A pod writing 5 MiB into its root file system and 3 MiB (plus a directory of two empty
/// files) into an emptyDir: the container's `rootfs` and the pod's `volume` entry show
/// them, `ephemeral-storage` counts both, the figures of the file systems they are on come
/// along, and `?only_cpu_and_memory=true` leaves the file systems out.
fn stats_file_systems(env: &Env) -> Result<()> {
    let name = "kapi-stats-fs";
    block_on(async {
        let pods = create_pod(env, json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": "default" },
            "spec": {
                "nodeName": env.agent.node_name,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "volumes": [{ "name": "scratch", "emptyDir": {} }],
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c",
                        "head -c 5242880 /dev/zero > /big && head -c 3145728 /dev/zero > /scratch/f \
                         && mkdir /scratch/d && touch /scratch/d/a /scratch/d/b && touch /done \
                         && sleep 3600"],
                    "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }],
                }],
            },
        }))
        .await?;
        let result = async {
            wait_running(&pods, name, 0).await?;
            let summary = eventually(
                "the written files in /stats/summary",
                Duration::from_secs(45),
                || async {
                    let summary = summary(env)?;
                    let Some(pod) = pod_entry(&summary, name) else {
                        return Ok(None);
                    };
                    let rootfs = fs_used(&pod["containers"][0]["rootfs"]);
                    let volume = pod["volume"]
                        .as_array()
                        .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
                        .and_then(fs_used);
                    let done =
                        matches!((rootfs, volume), (Some((r, _)), Some((_, 5))) if r >= 5 * MIB);
                    Ok(done.then_some(summary))
                },
            )
            .await?;
            let pod = pod_entry(&summary, name).context("pod entry")?;
            let image_fs = &summary["node"]["runtime"]["imageFs"];
            let rootfs = &pod["containers"][0]["rootfs"];
            let (layer, layer_inodes) = fs_used(rootfs).context("rootfs")?;
            // /big and /done, and what the runtime made in the layer (mount points).
            assert!((5 * MIB..6 * MIB).contains(&layer), "{rootfs}");
            assert!((2..50).contains(&layer_inodes), "{rootfs}");
            assert_eq!(
                rootfs["capacityBytes"], image_fs["capacityBytes"],
                "{summary}"
            );
            assert!(rootfs["availableBytes"].as_u64().is_some(), "{rootfs}");
            let volumes = pod["volume"].as_array().context("volumes")?;
            let scratch = volumes
                .iter()
                .find(|v| v["name"] == "scratch")
                .context("scratch")?;
            let (written, inodes) = fs_used(scratch).context("scratch figures")?;
            // The volume's directory, f, d, d/a, d/b; f in whole blocks.
            assert_eq!(inodes, 5, "{scratch}");
            assert!(
                (3 * MIB..3 * MIB + 64 * 1024).contains(&written),
                "{scratch}"
            );
            assert!(
                scratch["capacityBytes"].as_u64().unwrap_or(0) > written,
                "{scratch}"
            );
            assert!(scratch["time"].as_str().is_some_and(|t| t.ends_with('Z')));
            // The service account token: projected, on tmpfs, measured but not ephemeral.
            assert!(
                volumes.iter().any(|v| v["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kube-api-access"))),
                "{volumes:?}"
            );
            let ephemeral = &pod["ephemeral-storage"];
            let (pod_used, pod_inodes) = fs_used(ephemeral).context("ephemeral-storage")?;
            let logs = pod["containers"][0]["logs"]["usedBytes"]
                .as_u64()
                .unwrap_or(0);
            assert_eq!(pod_used, layer + written + logs, "{pod}");
            assert!(pod_inodes >= layer_inodes + inodes, "{pod}");
            assert!(summary["node"]["fs"]["usedBytes"].as_u64() > Some(pod_used));

            let text = node_proxy(env, "/stats/summary?only_cpu_and_memory=true")?;
            let light: serde_json::Value = serde_json::from_str(&text)?;
            let pod = pod_entry(&light, name).context("pod in the cpu-and-memory summary")?;
            assert!(
                pod["containers"][0]["memory"]["workingSetBytes"].is_u64(),
                "{pod}"
            );
            assert!(pod.get("volume").is_none() && pod.get("ephemeral-storage").is_none());
            assert!(pod["containers"][0].get("rootfs").is_none(), "{pod}");
            assert!(light["node"].get("fs").is_none(), "{light}");
            Ok(())
        }
        .await;
        remove_pod(&pods, name).await?;
        result
    })
}

/// metrics-server as a host process, with the APIService and the ExternalName Service that
/// route `metrics.k8s.io` to it; all of it removed on drop.
struct MetricsServer<'a> {
    env: &'a Env,
    child: std::process::Child,
    dir: PathBuf,
}

impl<'a> MetricsServer<'a> {
    fn start(env: &'a Env) -> Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/metrics-server");
        let built = Command::new(&script)
            .arg("build")
            .stderr(Stdio::inherit())
            .output()
            .context("running scripts/metrics-server build")?;
        if !built.status.success() {
            bail!("scripts/metrics-server build failed");
        }
        let binary = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!("kapi-metrics-server-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let admin = env.plane.admin_kubeconfig();
        let log = std::fs::File::create(dir.join("metrics-server.log"))?;
        let child = Command::new(&binary)
            .arg(format!("--secure-port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--kubeconfig={}", admin.display()))
            .arg(format!("--authentication-kubeconfig={}", admin.display()))
            .arg(format!("--authorization-kubeconfig={}", admin.display()))
            .arg(format!(
                "--kubelet-certificate-authority={}",
                env.plane.dir().join("pki/ca.crt").display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--kubelet-use-node-status-port")
            .arg("--metric-resolution=10s")
            .arg("--kubelet-request-timeout=5s")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting metrics-server")?;
        let server = Self { env, child, dir };
        let manifest = server.dir.join("apiservice.json");
        let objects = json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": { "name": "metrics-server", "namespace": "kube-system" },
                    "spec": { "type": "ExternalName", "externalName": "localhost" },
                },
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": { "name": "v1beta1.metrics.k8s.io" },
                    "spec": {
                        "group": "metrics.k8s.io",
                        "version": "v1beta1",
                        "groupPriorityMinimum": 100,
                        "versionPriority": 100,
                        "insecureSkipTLSVerify": true,
                        "service": { "name": "metrics-server", "namespace": "kube-system", "port": port },
                    },
                },
            ],
        });
        std::fs::write(&manifest, objects.to_string())?;
        env.plane
            .kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
        Ok(server)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("metrics-server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for MetricsServer<'_> {
    fn drop(&mut self) {
        let _ = self
            .env
            .plane
            .kubectl(&["delete", "apiservice", "v1beta1.metrics.k8s.io"]);
        let _ =
            self.env
                .plane
                .kubectl(&["delete", "service", "-n", "kube-system", "metrics-server"]);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `kubectl top …` until it succeeds with a line for `name`; that line's columns.
fn top_until(env: &Env, args: &[&str], name: &str, server: &MetricsServer) -> Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = env.plane.kubectl(args);
        if let Ok(text) = &out {
            let row = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name));
            if let Some(row) = row {
                return Ok(row.split_whitespace().map(str::to_owned).collect());
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "kubectl {} never listed {name}: {out:?}\nmetrics-server log:\n{}",
                args.join(" "),
                server.log_tail()
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Column `index` of a `kubectl top` row as a number (see [`quantity`]).
fn column(row: &[String], index: usize, what: &str) -> Result<u64> {
    row.get(index)
        .and_then(|c| quantity(c))
        .with_context(|| format!("{what} in {row:?}"))
}

/// `41Mi` → bytes, `250m` → millicores (the quantities `kubectl top` prints).
fn quantity(text: &str) -> Option<u64> {
    let (digits, factor) = if let Some(n) = text.strip_suffix("Mi") {
        (n, MIB)
    } else if let Some(n) = text.strip_suffix("Ki") {
        (n, 1024)
    } else if let Some(n) = text.strip_suffix("Gi") {
        (n, 1024 * MIB)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 1)
    } else {
        (text, 1)
    };
    digits.parse::<u64>().ok().map(|n| n * factor)
}

fn kubectl_top(env: &Env) -> Result<()> {
    let name = "kapi-top";
    with_pod(env, name, BUSY_40MIB, "Never", |_pods| async move {
        let server = MetricsServer::start(env)?;
        let node = env.agent.node_name.as_str();
        // NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)
        let node_row = top_until(env, &["top", "node", "--no-headers"], node, &server)?;
        let cpu = column(&node_row, 1, "node cpu")?;
        let memory = column(&node_row, 3, "node memory")?;
        assert!(cpu > 0, "{node_row:?}");
        assert!(memory >= 40 * MIB && memory <= mem_total()?, "{node_row:?}");
        // NAME CPU(cores) MEMORY(bytes): the spinning shell and tail's 40 MiB.
        let pod_row = top_until(env, &["top", "pod", name, "--no-headers"], name, &server)?;
        let cpu = column(&pod_row, 1, "pod cpu")?;
        let memory = column(&pod_row, 2, "pod memory")?;
        assert!(
            cpu >= 100,
            "a spinning shell uses at least 100m: {pod_row:?}"
        );
        assert!(memory >= 40 * MIB, "{pod_row:?}");
        let containers =
            env.plane
                .kubectl(&["top", "pod", name, "--containers", "--no-headers"])?;
        assert!(containers.contains(" main "), "{containers}");
        eprintln!("kubectl top node: {node_row:?}; kubectl top pod: {pod_row:?}");
        drop(server);
        Ok(())
    })
}

fn metrics_probes(env: &Env) -> Result<()> {
    let name = "kapi-probed";
    block_on(async {
        let client = env.plane.admin_client().await?;
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": "default" },
            "spec": {
                "nodeName": env.agent.node_name,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "readinessProbe": { "exec": { "command": ["true"] }, "periodSeconds": 1 },
                }],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let result = async {
            wait_running(&pods, name, 0).await?;
            let uid = pods.get(name).await?.metadata.uid.context("uid")?;
            let series = format!(
                "prober_probe_total{{container=\"main\",namespace=\"default\",pod=\"{name}\",pod_uid=\"{uid}\",probe_type=\"Readiness\",result=\"successful\"}}"
            );
            eventually(
                "two successful readiness probes in /metrics/probes",
                Duration::from_secs(30),
                || async {
                    let text = node_proxy(env, "/metrics/probes")?;
                    Ok(sample(&text, &series).filter(|(n, _)| *n >= 2.0).map(|_| ()))
                },
            )
            .await?;
            let text = node_proxy(env, "/metrics/probes")?;
            assert!(text.contains("# TYPE prober_probe_total counter\n"), "{text}");
            let failed = series.replace("result=\"successful\"", "result=\"failed\"");
            assert_eq!(sample(&text, &failed), Some((0.0, None)), "{text}");
            Ok::<_, anyhow::Error>(uid)
        }
        .await;
        remove_pod(&pods, name).await?;
        let uid = result?;
        let text = node_proxy(env, "/metrics/probes")?;
        assert!(
            !text.contains(&uid),
            "the removed pod's series stay: {text}"
        );
        Ok(())
    })
}

/// busybox `httpd` on port 80 serving `/www`: `index.html` and `big`, 20 MiB of random bytes.
const HTTPD: &str = "mkdir -p /www && echo hello-through-port-forward > /www/index.html && \
                     head -c 20971520 /dev/urandom > /www/big && exec httpd -f -p 80 -h /www";
const BIG_SIZE: usize = 20 * 1024 * 1024;

/// A running `kubectl port-forward`, killed on drop; its stderr goes to a file.
struct PortForward {
    child: std::process::Child,
    local: u16,
    stderr: PathBuf,
}

impl PortForward {
    /// `kubectl port-forward pod/POD :REMOTE` on 127.0.0.1, once it said where it listens.
    fn start(env: &Env, pod: &str, remote: u16) -> Result<Self> {
        Self::start_with(env, pod, remote, true)
    }

    /// With `websockets` false, kubectl speaks plain SPDY to the API server
    /// (`KUBECTL_PORT_FORWARD_WEBSOCKETS=false`), which passes the upgrade on to the node
    /// as it is: the path of API servers that do not tunnel.
    fn start_with(env: &Env, pod: &str, remote: u16, websockets: bool) -> Result<Self> {
        let stderr =
            std::env::temp_dir().join(format!("kapi-pf-{}-{pod}-{remote}.err", std::process::id()));
        let file = std::fs::File::create(&stderr).context("creating kubectl's stderr file")?;
        let mut child = env
            .plane
            .kubectl_command()
            .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets.to_string())
            .args(["port-forward", "--address", "127.0.0.1"])
            .arg(format!("pod/{pod}"))
            .arg(format!(":{remote}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .context("starting kubectl port-forward")?;
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let rx = ironlet_e2e::forwarded_port(stdout);
        let mut forward = Self {
            child,
            local: 0,
            stderr,
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(port) => forward.local = port,
            Err(_) => bail!(
                "kubectl port-forward never said where it listens: {}",
                forward.stderr_text()
            ),
        }
        Ok(forward)
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn connect(&self) -> Result<std::net::TcpStream> {
        let stream = std::net::TcpStream::connect(("127.0.0.1", self.local))
            .context("connecting to kubectl's local port")?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(stream)
    }

    /// `GET path` (HTTP/1.0, so the server closes the connection); the status line and body.
    fn get(&self, path: &str) -> Result<(String, Vec<u8>)> {
        let mut stream = self.connect()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
        read_response(&mut stream)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// Reads an HTTP/1.0 response to its end: the status line and the body.
fn read_response(stream: &mut std::net::TcpStream) -> Result<(String, Vec<u8>)> {
    use std::io::Read;
    let mut all = Vec::new();
    stream
        .read_to_end(&mut all)
        .context("reading the response")?;
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no header end in {:?}", String::from_utf8_lossy(&all)))?;
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.lines().next().unwrap_or("").to_owned();
    Ok((status, all[split + 4..].to_vec()))
}

/// Waits until the pod's httpd answers on its own loopback (a port-forward to a port not
/// yet listening fails, and kubectl then ends the whole session).
fn wait_httpd(env: &Env, pod: &str) -> Result<()> {
    let script = "for i in $(seq 150); do \
                  wget -q -O /dev/null http://127.0.0.1/index.html && exit 0; sleep 0.2; done; exit 1";
    let out = kubectl_exec_sh(env, pod, script)?;
    if !out.status.success() {
        bail!("httpd never answered in {pod}: {out:?}");
    }
    Ok(())
}

/// The first page through `forward`.
fn first_page(forward: &PortForward) -> Result<Vec<u8>> {
    match forward.get("/index.html") {
        Ok((status, body)) if status.contains(" 200 ") => Ok(body),
        other => bail!(
            "no page through port-forward: {other:?}\nkubectl: {}",
            forward.stderr_text()
        ),
    }
}

/// `/big` through `forward`, checked against the pod's `sha256sum` line; prints MB/s.
fn fetch_big(forward: &PortForward, in_pod: &str, how: &str) -> Result<Vec<u8>> {
    let started = Instant::now();
    let (status, big) = forward.get("/big")?;
    let elapsed = started.elapsed();
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(big.len(), BIG_SIZE, "the whole file ({how})");
    assert_eq!(
        in_pod.split_whitespace().next(),
        Some(sha256_hex(&big).as_str()),
        "the same bytes ({how})"
    );
    eprintln!(
        "port-forward ({how}): 20 MiB in {elapsed:?}, {:.1} MB/s",
        BIG_SIZE as f64 / 1e6 / elapsed.as_secs_f64()
    );
    Ok(big)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn port_forward(env: &Env) -> Result<()> {
    let name = "kapi-port-forward";
    let port = node_port(env)?;
    with_pod(env, name, HTTPD, "Never", |pods| async move {
        wait_httpd(env, name)?;
        let forward = PortForward::start(env, name, 80)?;
        let page = first_page(&forward)?;
        assert_eq!(page, b"hello-through-port-forward\n");

        // 20 MiB, byte for byte (the pod's own sha256sum of the file).
        let in_pod = kubectl_exec_sh(env, name, "sha256sum /www/big")?;
        let in_pod = String::from_utf8_lossy(&in_pod.stdout).into_owned();
        let big = fetch_big(&forward, &in_pod, "SPDY tunnelled in WebSocket")?;
        // The same over plain SPDY (a second session at the same time).
        let spdy = PortForward::start_with(env, name, 80, false)?;
        assert_eq!(first_page(&spdy)?, b"hello-through-port-forward\n");
        fetch_big(&spdy, &in_pod, "plain SPDY")?;
        drop(spdy);

        // Two connections at once: the first has sent half a request and waits while the
        // second is served whole; then the first completes.
        let mut first = forward.connect()?;
        first.write_all(b"GET /index.html HTTP/1.0\r\n")?;
        let (status, body) = forward.get("/index.html")?;
        assert!(status.contains(" 200 "), "second: {status}");
        assert_eq!(body, b"hello-through-port-forward\n");
        first.write_all(b"\r\n")?;
        let (status, body) = read_response(&mut first)?;
        assert!(status.contains(" 200 "), "first: {status}");
        assert_eq!(body, b"hello-through-port-forward\n");
        // And several in parallel threads, each its own stream pair.
        let fetches: Vec<_> = (0..4)
            .map(|_| {
                let local = forward.local;
                std::thread::spawn(move || -> Result<Vec<u8>> {
                    let mut stream = std::net::TcpStream::connect(("127.0.0.1", local))?;
                    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
                    stream.write_all(b"GET /big HTTP/1.0\r\n\r\n")?;
                    Ok(read_response(&mut stream)?.1)
                })
            })
            .collect();
        for fetch in fetches {
            let body = fetch
                .join()
                .map_err(|_| anyhow::anyhow!("a fetch panicked"))??;
            assert_eq!(sha256_hex(&body), sha256_hex(&big), "a parallel fetch");
        }
        drop(forward);

        // Straight to the node as the API server: the pod's uid in the path is checked
        // (404 for another), an unknown pod is 404, and a request that is no upgrade 400.
        let uid = pods.get(name).await?.metadata.uid.unwrap_or_default();
        let pki = env.plane.dir().join("pki");
        let (cert, key) = (
            pki.join("apiserver-kubelet-client.crt"),
            pki.join("apiserver-kubelet-client.key"),
        );
        let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
        let as_apiserver = ["--cert", &cert, "--key", &key];
        for (path, want) in [
            (format!("/portForward/default/{name}/{uid}"), "400"),
            (format!("/portForward/default/{name}"), "400"),
            (format!("/portForward/default/{name}/not-{uid}"), "404"),
            ("/portForward/default/no-such-pod".to_owned(), "404"),
        ] {
            assert_eq!(curl(env, port, &path, &as_apiserver)?, want, "{path}");
        }
        Ok(())
    })
}

fn port_forward_closed_port(env: &Env) -> Result<()> {
    let name = "kapi-port-forward-closed";
    with_pod(env, name, HTTPD, "Never", |_pods| async move {
        wait_httpd(env, name)?;
        let good = PortForward::start(env, name, 80)?;
        first_page(&good)?;
        let mut bad = PortForward::start(env, name, 81)?;
        // The local connection is accepted, then closed without data.
        let mut conn = bad.connect()?;
        conn.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut conn, &mut got);
        assert!(got.is_empty(), "nothing listens on 81: {got:?}");
        // kubectl prints the node's error and (v1.37) ends the session it came on.
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = bad.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                bail!("kubectl port-forward :81 still runs: {}", bad.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let stderr = bad.stderr_text();
        eprintln!("kubectl port-forward :81 exited {status}: {stderr}");
        assert!(
            stderr.contains("error forwarding port 81 to pod")
                && stderr.contains("failed to connect to localhost:81 inside namespace")
                && stderr.contains("connection refused"),
            "kubelet's message: {stderr}"
        );
        // The other session, and a new one, still forward.
        assert_eq!(first_page(&good)?, b"hello-through-port-forward\n");
        let again = PortForward::start(env, name, 80)?;
        assert_eq!(first_page(&again)?, b"hello-through-port-forward\n");
        Ok(())
    })
}

fn port_forward_refused(env: &Env) -> Result<()> {
    let name = "kapi-port-forward-refused";
    let path = format!("/portForward/default/{name}");
    let protocol = "SPDY/3.1+portforward.k8s.io";
    refused_401_403(env, name, &path, protocol, "kapi-port-forward-nobody")
}

/// Established TCP connections on port 80 in the pod's network namespace (both ends of the
/// node's connection to httpd count), from its `/proc/net/tcp` and `tcp6` (httpd listens on
/// `:::80`, so its end of a connection to 127.0.0.1 is in `tcp6`).
fn pod_connections_on_80(env: &Env, pod: &str) -> Result<usize> {
    let out = kubectl_exec_sh(env, pod, "cat /proc/net/tcp /proc/net/tcp6")?;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(table
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st: "0100007F:0050 0100007F:9C40 01".
            fields.len() > 3
                && fields[3] == "01"
                && (fields[1].ends_with(":0050") || fields[2].ends_with(":0050"))
        })
        .count())
}

fn port_forward_client_killed(env: &Env) -> Result<()> {
    let name = "kapi-port-forward-killed";
    with_pod(env, name, HTTPD, "Never", |_pods| async move {
        wait_httpd(env, name)?;
        let forward = PortForward::start(env, name, 80)?;
        // Half a request: httpd waits for the rest, the connection stays open.
        let mut conn = forward.connect()?;
        conn.write_all(b"GET /index.html HTTP/1.0\r\n")?;
        let connections = |want: usize, what: &'static str| {
            eventually(what, Duration::from_secs(15), move || async move {
                Ok((pod_connections_on_80(env, name)? == want).then_some(()))
            })
        };
        connections(2, "the forwarded connection is open in the pod").await?;
        drop(forward);
        connections(0, "no connection left in the pod once kubectl is gone").await?;
        drop(conn);
        Ok(())
    })
}

fn port_forward_host_network(env: &Env) -> Result<()> {
    let name = "kapi-port-forward-host";
    // A free port on the host, for httpd bound to the host's loopback only.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let script = format!(
        "mkdir -p /www && echo on-the-host > /www/index.html && \
         exec httpd -f -p 127.0.0.1:{port} -h /www"
    );
    block_on(async {
        let pods = run_pod_with(env, name, &script, "Never", true).await?;
        let result = async {
            eventually("httpd on the host", Duration::from_secs(30), || async {
                Ok(std::net::TcpStream::connect(("127.0.0.1", port))
                    .ok()
                    .map(|_| ()))
            })
            .await?;
            let forward = PortForward::start(env, name, port)?;
            let (status, body) = forward.get("/index.html")?;
            assert!(
                status.contains(" 200 "),
                "{status}: {}",
                forward.stderr_text()
            );
            assert_eq!(body, b"on-the-host\n");
            Ok(())
        }
        .await;
        remove_pod(&pods, name).await?;
        result
    })
}

//! The kubelet API of a real `ironlet run --kubeconfig` joined to a real control plane
//! (`scripts/controlplane`), driven by the real `kubectl` through the real kube-apiserver
//! (which reaches the node with its kubelet client certificate and verifies the node's
//! serving certificate): `kubectl logs` plain, `--tail`, `-f` until the container exits,
//! `--previous` after a restart; a follower that goes away leaves no reader behind; and the
//! node itself refuses requests without credentials (401), with a token whose user has no
//! RBAC for `nodes/proxy` (403, then allowed once it has), and with a client certificate
//! from another CA (handshake refused). The agent starts with `--config`: `/configz`
//! shows a value from the file and one a flag overrode.
//!
//! One control plane and one agent (node `e2e-kapi-<pid>`) serve every test of this binary;
//! the tests use distinct pod names. Needs root (containers, cgroups, CNI).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ironlet_e2e::{eventually, run_suite, ClusterAgent, ControlPlane, SuiteTest};
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
        "the_node_refuses_no_credentials_401_a_token_without_rbac_403_and_allows_it_with_rbac",
        token_authn_authz,
    ),
    (
        "the_node_refuses_a_client_certificate_from_another_ca_and_accepts_the_apiservers",
        client_certificates,
    ),
    (
        "configz_shows_the_config_file_s_values_and_the_flags_that_override_them",
        configz,
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
             maxPods: {CONFIG_MAX_PODS}\nstaticPodPath: /nonexistent/from-config\n"
        ),
    )
    .context("writing the agent's config file")?;
    let extra = [std::ffi::OsStr::new("--config"), config.as_os_str()];
    let agent =
        ClusterAgent::start_with_args(&kubeconfig, &node, 100 + std::process::id() % 150, &extra);
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

fn block_on<T, F: std::future::Future<Output = Result<T>>>(f: F) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?
        .block_on(f)
}

/// A busybox pod on the test node running `script` with `sh -c`.
async fn run_pod(env: &Env, name: &str, script: &str, restart: &str) -> Result<Api<Pod>> {
    let client = env.plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": env.agent.node_name,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))?;
    eventually("the pod is created", Duration::from_secs(30), || async {
        pods.create(&PostParams::default(), &pod).await?;
        Ok(Some(()))
    })
    .await?;
    wait_running(&pods, name, 0).await?;
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

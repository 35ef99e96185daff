//! The kubelet API through the API server (issue 13): a real control plane
//! (`scripts/controlplane`), a real `ironlet run --kubeconfig` node and, in the same run, an
//! upstream kubelet + containerd node (`scripts/peer-kubelet`, its kubelet API secured as on a
//! real node: x509 client certificates, webhook authentication and authorization, like
//! ironlet's). Both nodes serve on the host's address with serving certificates of the cluster
//! CA, which the API server verifies. Every client is the real `kubectl` of the control plane,
//! started as a process per command (its start-up is in every figure, equally for both nodes).
//!
//! Measured, the nodes interleaved (the order flips every round):
//! - `kubectl exec POD -- true`: round trip, p50/p99 over N (default 50) per node;
//! - the same exec driven in-process by a Rust client (kube-rs `Api::<Pod>::exec`: a
//!   WebSocket upgrade to the API server, `v5.channel.k8s.io`, stdout and stderr attached as
//!   kubectl does without `-i`): from the request to the exit status, p50/p99 over N per
//!   node. No process start, no discovery, no kubectl: what is left is the API server's part
//!   (TLS, authentication, authorization, the upgrade and the proxying) and the node's;
//! - `kubectl logs POD` of a container that wrote 100 MiB of 100-byte lines: the time to read
//!   it all (bytes checked), and the node's peak RSS while it streams, sampled every 10 ms as
//!   the sum over the node's processes (ironlet: every process of the agent's binary, i.e.
//!   supervisor and agent; peer: every process of its binaries, i.e. kubelet, containerd and
//!   the shims), against the same sum just before;
//! - `kubectl port-forward`: one connection fetching 100 MiB (random bytes, busybox `httpd`
//!   in the pod) through the tunnel, MB/s.
//!
//! Usage (root): `kubelet-api [N] [--rounds=R] [--no-peer]` (R, rounds of logs and
//! port-forward, default 3; `--no-peer`: ironlet alone, no ratios), with `IRONLET_BIN` naming the `ironlet` binary (default: beside this binary) and
//! `scripts/peer-kubelet build` done once. Both nodes rotate container logs at 200 MiB
//! (`--container-log-max-size`, `containerLogMaxSize`) so that the whole 100 MiB log stays in
//! one file on each. Teardown (always, also after a failure): every bench pod deleted and
//! awaited, the peer's `down`, the agent stopped, the control plane `down`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_e2e::{
    create_pod, eventually, forwarded_port, routable_host_ip, ClusterAgent, ControlPlane,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use ironlet_bench::cluster::{
    self, delete_all_labelled, describe_node, ironlet_bin_beside_this, load_average, teardown,
    wait_node_ready,
};
use ironlet_bench::peer_node::PeerNode;
use ironlet_bench::stats::{ms, percentile};

const LABEL_KEY: &str = "ironlet-bench";
const LABEL_VALUE: &str = "kubelet-api";
const NAMESPACE: &str = "default";
/// The log the logs pod writes: 100 MiB of 100-byte lines, then [`LOG_END`].
const LOG_BYTES: u64 = 100 * 1024 * 1024;
const LOG_END: &str = "bench-log-end";
/// The file the web pod serves through port-forward.
const BIG_BYTES: u64 = 100 * 1024 * 1024;
const LOG_MAX_SIZE: &str = "200Mi";

struct Args {
    n: usize,
    rounds: usize,
    /// No peer node: ironlet's figures alone (no ratios).
    peer: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        n: 50,
        rounds: 3,
        peer: true,
    };
    for arg in std::env::args().skip(1) {
        if arg == "--no-peer" {
            args.peer = false;
        } else if let Some(r) = arg.strip_prefix("--rounds=") {
            args.rounds = r
                .parse()
                .with_context(|| format!("--rounds must be a number: {r}"))?;
        } else {
            args.n = arg
                .parse()
                .with_context(|| format!("N must be a number: {arg}"))?;
        }
    }
    ensure!(args.n > 0 && args.rounds > 0, "N and R must be at least 1");
    Ok(args)
}

/// One node under test and how to find its processes.
struct BenchNode {
    name: String,
    /// `ironlet` or `kubelet`.
    short: &'static str,
    /// A process belongs to the node when its executable is one of these or lies under one.
    exes: Vec<PathBuf>,
}

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let args = parse_args()?;
    // Before any thread exists: ClusterAgent and scripts/peer-kubelet read them.
    ironlet_bin_beside_this()?;
    std::env::set_var("IRONLET_PEER_CONTAINER_LOG_MAX_SIZE", LOG_MAX_SIZE);
    println!("load average at start: {}", load_average());
    let host_ip = routable_host_ip().context("no routable host address for the nodes")?;
    // Dropped in reverse order: peer, agent, control plane.
    let plane = ControlPlane::up()?;
    // Names of their own: api-pod-start's node (`bench-ironlet`, data root
    // /tmp/ironlet-e2e-bench-ironlet) may be running for someone else.
    let ironlet_name = "kapi-bench-ironlet".to_owned();
    let agent = ClusterAgent::start_on(
        &plane.node_kubeconfig(&ironlet_name)?,
        &ironlet_name,
        252,
        &["--container-log-max-size".as_ref(), LOG_MAX_SIZE.as_ref()],
        host_ip,
    )?;
    let peer = if args.peer {
        Some(PeerNode::up(&plane, "kapi-bench-kubelet")?)
    } else {
        None
    };
    let mut nodes = vec![BenchNode {
        name: ironlet_name,
        short: "ironlet",
        exes: vec![agent.root.join("ironlet")],
    }];
    if let Some(peer) = &peer {
        nodes.push(BenchNode {
            name: peer.node.clone(),
            short: "kubelet",
            exes: vec![peer.bin.clone()],
        });
    }
    let rt = ironlet_bench::runtime()?;
    let outcome = run(&rt, &plane, &nodes, &args);
    let cleanup = rt.block_on(delete_all_labelled(
        &plane,
        NAMESPACE,
        &format!("{LABEL_KEY}={LABEL_VALUE}"),
    ));
    teardown(rt, plane, agent, peer, outcome, cleanup)
}

fn run(
    rt: &tokio::runtime::Runtime,
    plane: &ControlPlane,
    nodes: &[BenchNode],
    args: &Args,
) -> Result<()> {
    rt.block_on(async {
        let client = plane.admin_client().await?;
        for node in nodes {
            wait_node_ready(&client, &node.name).await?;
            println!("{}", describe_node(&client, &node.name).await?);
        }
        let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
        for node in nodes {
            create_pod(&pods, &logs_pod(node)?).await?;
            create_pod(&pods, &web_pod(node)?).await?;
        }
        for node in nodes {
            wait_running(&pods, &format!("{}-logs", node.short)).await?;
            wait_running(&pods, &format!("{}-web", node.short)).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    for node in nodes {
        wait_log_written(plane, node)?;
        wait_web(plane, node)?;
    }
    println!(
        "load average before measuring: {} ({} exec per node, {} rounds of logs and port-forward)",
        load_average(),
        args.n,
        args.rounds
    );

    // exec: two unmeasured per node first (kubectl's and the connections' warm-up).
    for node in nodes {
        for _ in 0..2 {
            exec_true(plane, node)?;
        }
    }
    let mut exec: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.n); nodes.len()];
    for round in 0..args.n {
        for k in order(round, nodes.len()) {
            exec[k].push(exec_true(plane, &nodes[k])?);
        }
    }
    // The same exec in-process, the client's connections warmed up the same way.
    let in_process = rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, NAMESPACE);
        for node in nodes {
            for _ in 0..2 {
                exec_true_in_process(&pods, node).await?;
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.n); nodes.len()];
        for round in 0..args.n {
            for k in order(round, nodes.len()) {
                times[k].push(exec_true_in_process(&pods, &nodes[k]).await?);
            }
        }
        Ok::<_, anyhow::Error>(times)
    })?;

    let mut logs: Vec<Vec<LogsSample>> = vec![Vec::new(); nodes.len()];
    for round in 0..args.rounds {
        for k in order(round, nodes.len()) {
            let sample = logs_once(plane, &nodes[k])?;
            println!(
                "  logs {:<8} {:>7.0} ms  {:>6.1} MB/s  RSS before {:>6.1} MiB  peak {:>6.1} MiB",
                nodes[k].short,
                ms(sample.time),
                mb_per_s(sample.bytes, sample.time),
                mib(sample.rss_before),
                mib(sample.rss_peak)
            );
            logs[k].push(sample);
        }
    }

    let forwards = nodes
        .iter()
        .map(|node| PortForward::start(plane, &format!("{}-web", node.short)))
        .collect::<Result<Vec<_>>>()?;
    let mut forward: Vec<Vec<f64>> = vec![Vec::new(); nodes.len()];
    for round in 0..args.rounds {
        for k in order(round, nodes.len()) {
            let rate = forwards[k].fetch_big()?;
            println!("  port-forward {:<8} {rate:>6.1} MB/s", nodes[k].short);
            forward[k].push(rate);
        }
    }
    drop(forwards);

    report(nodes, &exec, &in_process, &logs, &forward);
    Ok(())
}

/// The node indexes of `round`, reversed every other round.
fn order(round: usize, count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn mb_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / 1e6 / time.as_secs_f64()
}

fn busybox_pod(name: &str, node: &BenchNode, script: &str) -> Result<Pod> {
    cluster::busybox_pod(
        name,
        NAMESPACE,
        (LABEL_KEY, LABEL_VALUE),
        &node.name,
        script,
    )
}

/// Writes [`LOG_BYTES`] of 100-byte lines (99 characters and the newline) to stdout, then
/// [`LOG_END`], then sleeps.
fn logs_pod(node: &BenchNode) -> Result<Pod> {
    let line = "x".repeat(99);
    busybox_pod(
        &format!("{}-logs", node.short),
        node,
        &format!("yes {line} | head -c {LOG_BYTES}; echo {LOG_END}; exec sleep 3600"),
    )
}

/// busybox `httpd` on port 80 serving `/www/big`, [`BIG_BYTES`] of random bytes, and
/// `/www/ready` once `big` is complete.
fn web_pod(node: &BenchNode) -> Result<Pod> {
    busybox_pod(
        &format!("{}-web", node.short),
        node,
        &format!(
            "mkdir -p /www && head -c {BIG_BYTES} /dev/urandom > /www/big && echo ok > /www/ready \
             && exec httpd -f -p 80 -h /www"
        ),
    )
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<()> {
    eventually(
        &format!("pod {name} Running"),
        Duration::from_secs(120),
        || async {
            let pod = pods.get(name).await?;
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Failed" || phase == "Succeeded" {
                bail!("pod {name} ended: {phase}");
            }
            Ok((phase == "Running").then_some(()))
        },
    )
    .await
}

/// `kubectl` as admin with `args`, its stdout; an error with its stderr if it failed.
fn kubectl(plane: &ControlPlane, args: &[&str]) -> Result<String> {
    plane.kubectl(args)
}

/// Waits until the logs pod printed [`LOG_END`] (its whole log is written).
fn wait_log_written(plane: &ControlPlane, node: &BenchNode) -> Result<()> {
    let pod = format!("{}-logs", node.short);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let tail = kubectl(plane, &["logs", "--tail=1", &pod])?;
        if tail.trim() == LOG_END {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{pod} did not write its log within 300 s (last line {tail:?})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until the web pod's file is complete and its httpd answers.
fn wait_web(plane: &ControlPlane, node: &BenchNode) -> Result<()> {
    let pod = format!("{}-web", node.short);
    let script = "for i in $(seq 300); do \
                  wget -q -O /dev/null http://127.0.0.1/ready && exit 0; sleep 0.2; done; exit 1";
    kubectl(plane, &["exec", &pod, "--", "sh", "-c", script])
        .with_context(|| format!("httpd never answered in {pod}"))?;
    Ok(())
}

/// One `kubectl exec POD -- true`, timed from spawn to exit.
fn exec_true(plane: &ControlPlane, node: &BenchNode) -> Result<Duration> {
    let pod = format!("{}-web", node.short);
    let started = Instant::now();
    let output = plane
        .kubectl_command()
        .args(["exec", &pod, "--", "true"])
        .stdin(Stdio::null())
        .output()
        .context("running kubectl exec")?;
    let elapsed = started.elapsed();
    ensure!(
        output.status.success(),
        "kubectl exec {pod} -- true failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(elapsed)
}

/// `true` in the web pod through kube-rs's exec subresource (WebSocket through the API
/// server), stdout and stderr attached as kubectl does without `-i`: from the request to the
/// exit status, which must be Success.
async fn exec_true_in_process(pods: &Api<Pod>, node: &BenchNode) -> Result<Duration> {
    let pod = format!("{}-web", node.short);
    let params = kube::api::AttachParams::default().container("main");
    let started = Instant::now();
    let mut process = pods
        .exec(&pod, ["true"], &params)
        .await
        .with_context(|| format!("exec in {pod}"))?;
    let status = process
        .take_status()
        .context("the exec's status channel")?
        .await;
    let elapsed = started.elapsed();
    process
        .join()
        .await
        .with_context(|| format!("the exec in {pod} ended badly"))?;
    let status = status.with_context(|| format!("no exit status from the exec in {pod}"))?;
    ensure!(
        status.status.as_deref() == Some("Success"),
        "exec true in {pod}: {status:?}"
    );
    Ok(elapsed)
}

#[derive(Clone, Copy)]
struct LogsSample {
    time: Duration,
    bytes: u64,
    rss_before: u64,
    rss_peak: u64,
}

/// The node's processes: every pid whose executable is (under) one of `node.exes`.
fn node_pids(node: &BenchNode) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        if node.exes.iter().any(|e| exe.starts_with(e)) {
            pids.push(pid);
        }
    }
    ensure!(!pids.is_empty(), "no process of node {}", node.name);
    Ok(pids)
}

/// The sum of `VmRSS` over `pids` (those gone count 0), in bytes.
fn rss_sum(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .sum()
}

/// `kubectl logs` of the node's logs pod, read to its end while the node's RSS is sampled.
fn logs_once(plane: &ControlPlane, node: &BenchNode) -> Result<LogsSample> {
    let pids = node_pids(node)?;
    let rss_before = rss_sum(&pids);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(rss_sum(&pids));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let pod = format!("{}-logs", node.short);
    let started = Instant::now();
    let result = read_logs(plane, &pod);
    let time = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let rss_peak = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the RSS sampler panicked"))?;
    let bytes = result?;
    let want = LOG_BYTES + LOG_END.len() as u64 + 1;
    ensure!(
        bytes == want,
        "kubectl logs {pod}: {bytes} bytes, expected {want}"
    );
    Ok(LogsSample {
        time,
        bytes,
        rss_before,
        rss_peak: rss_peak.max(rss_before),
    })
}

/// Runs `kubectl logs POD`, counting what it prints; the byte count.
fn read_logs(plane: &ControlPlane, pod: &str) -> Result<u64> {
    let mut child = plane
        .kubectl_command()
        .args(["logs", pod])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl logs")?;
    let mut stdout = child.stdout.take().context("kubectl's stdout")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = stdout.read(&mut buf).context("reading kubectl logs")?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    let output = child.wait_with_output().context("waiting for kubectl")?;
    ensure!(
        output.status.success(),
        "kubectl logs {pod} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(bytes)
}

/// A running `kubectl port-forward pod/POD :80` on 127.0.0.1, killed on drop.
struct PortForward {
    child: Child,
    local: u16,
    pod: String,
}

impl PortForward {
    fn start(plane: &ControlPlane, pod: &str) -> Result<Self> {
        let mut child = plane
            .kubectl_command()
            .args(["port-forward", "--address", "127.0.0.1"])
            .arg(format!("pod/{pod}"))
            .arg(":80")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kubectl port-forward")?;
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let rx = forwarded_port(stdout);
        let mut forward = Self {
            child,
            local: 0,
            pod: pod.to_owned(),
        };
        forward.local = rx
            .recv_timeout(Duration::from_secs(30))
            .context("kubectl port-forward never said where it listens")?;
        Ok(forward)
    }

    /// `GET /big` through one connection; MB/s from the request to the last byte.
    fn fetch_big(&self) -> Result<f64> {
        let started = Instant::now();
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.local))
            .context("connecting to kubectl's local port")?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.write_all(b"GET /big HTTP/1.0\r\n\r\n")?;
        let mut buf = vec![0u8; 1 << 20];
        let mut head = Vec::new();
        let mut body: Option<u64> = None;
        loop {
            let n = stream
                .read(&mut buf)
                .context("reading through port-forward")?;
            if n == 0 {
                break;
            }
            match body.as_mut() {
                Some(body) => *body += n as u64,
                None => {
                    head.extend_from_slice(&buf[..n]);
                    if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        ensure!(
                            head.starts_with(b"HTTP/1.0 200") || head.starts_with(b"HTTP/1.1 200"),
                            "GET /big from {}: {}",
                            self.pod,
                            String::from_utf8_lossy(&head[..end])
                        );
                        body = Some((head.len() - end - 4) as u64);
                    }
                }
            }
        }
        let elapsed = started.elapsed();
        let body = body.with_context(|| format!("no HTTP response from {}", self.pod))?;
        ensure!(
            body == BIG_BYTES,
            "GET /big from {}: {body} bytes, expected {BIG_BYTES}",
            self.pod
        );
        Ok(mb_per_s(body, elapsed))
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Prints each node's figures, then the ironlet/kubelet ratios.
fn report(
    nodes: &[BenchNode],
    exec: &[Vec<Duration>],
    in_process: &[Vec<Duration>],
    logs: &[Vec<LogsSample>],
    forward: &[Vec<f64>],
) {
    struct Row {
        p50: f64,
        p99: f64,
        rust_p50: f64,
        rust_p99: f64,
        logs_ms: f64,
        logs_rate: f64,
        rss_before: f64,
        rss_peak: f64,
        forward: f64,
    }
    println!(
        "  {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9}",
        "node",
        "exec p50",
        "exec p99",
        "rust p50",
        "rust p99",
        "logs ms",
        "logs MB/s",
        "RSS before",
        "RSS peak",
        "pf MB/s"
    );
    let mut rows = Vec::new();
    for (k, node) in nodes.iter().enumerate() {
        let mut times = exec[k].clone();
        times.sort();
        let mut rust = in_process[k].clone();
        rust.sort();
        let logs_ms: Vec<f64> = logs[k].iter().map(|s| ms(s.time)).collect();
        let logs_rate: Vec<f64> = logs[k].iter().map(|s| mb_per_s(s.bytes, s.time)).collect();
        let row = Row {
            p50: ms(percentile(&times, 50.0)),
            p99: ms(percentile(&times, 99.0)),
            rust_p50: ms(percentile(&rust, 50.0)),
            rust_p99: ms(percentile(&rust, 99.0)),
            logs_ms: median(&logs_ms),
            logs_rate: median(&logs_rate),
            rss_before: logs[k]
                .iter()
                .map(|s| mib(s.rss_before))
                .fold(0.0, f64::max),
            rss_peak: logs[k].iter().map(|s| mib(s.rss_peak)).fold(0.0, f64::max),
            forward: median(&forward[k]),
        };
        println!(
            "  {:<8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.0} {:>9.1} {:>11.1} {:>11.1} {:>9.1}",
            node.short,
            row.p50,
            row.p99,
            row.rust_p50,
            row.rust_p99,
            row.logs_ms,
            row.logs_rate,
            row.rss_before,
            row.rss_peak,
            row.forward
        );
        rows.push(row);
    }
    println!("  (exec: kubectl, rust: the in-process client, in ms; logs: median time and rate; RSS in MiB, the largest of the rounds; pf: median)");
    if let [i, k] = rows.as_slice() {
        println!(
            "  ratio ironlet/kubelet  exec p50 {:.2}  p99 {:.2}  |  in-process exec p50 {:.2}  p99 {:.2}  |  logs time {:.2}  peak RSS {:.2}  |  port-forward MB/s {:.2}",
            i.p50 / k.p50,
            i.p99 / k.p99,
            i.rust_p50 / k.rust_p50,
            i.rust_p99 / k.rust_p99,
            i.logs_ms / k.logs_ms,
            i.rss_peak / k.rss_peak,
            i.forward / k.forward
        );
    }
}

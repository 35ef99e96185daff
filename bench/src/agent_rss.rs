//! The agent's memory while it streams logs (issue 13's budget: the agent's RSS ≤ 40 MiB with
//! 100 pods while streaming): a real control plane (`scripts/controlplane`), a real
//! `ironlet run --kubeconfig` node, N (default 100, at most kubelet's default `--max-pods`
//! 110) API pods of busybox each printing a
//! 100-byte line every 100 ms, then F (default 10) concurrent `kubectl logs -f` of as many of
//! them, read and discarded, for S (default 30) seconds.
//!
//! Sampled every 100 ms: VmRSS of the agent process alone (found by its `/version` on the
//! local socket, so neither the supervisor, which is also the zygote, nor a forked worker is
//! counted), and the supervisor's for reference: before the follows (N pods running, 10 s
//! after the last became Running) and the peak while they stream. Each follower must have
//! received at least one line, or the run fails.
//!
//! Usage (root): `agent-rss [N] [--follows=F] [--secs=S]`, with `IRONLET_BIN` naming the
//! `ironlet` binary (default: beside this binary). Teardown (always): followers killed, every
//! pod deleted and awaited, the agent stopped, the control plane `down`.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ironlet_e2e::{create_pod, eventually, routable_host_ip, ClusterAgent, ControlPlane};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use ironlet_bench::cluster::{
    busybox_pod, delete_labelled, ironlet_bin_beside_this, load_average, wait_node_ready,
};

const LABEL_KEY: &str = "ironlet-bench";
const LABEL_VALUE: &str = "agent-rss";
const NAMESPACE: &str = "default";

struct Args {
    pods: usize,
    follows: usize,
    secs: u64,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        pods: 100,
        follows: 10,
        secs: 30,
    };
    for arg in std::env::args().skip(1) {
        let number = |v: &str| {
            v.parse::<usize>()
                .with_context(|| format!("not a number: {arg}"))
        };
        if let Some(v) = arg.strip_prefix("--follows=") {
            args.follows = number(v)?;
        } else if let Some(v) = arg.strip_prefix("--secs=") {
            args.secs = u64::try_from(number(v)?)?;
        } else {
            args.pods = number(&arg)?;
        }
    }
    ensure!(
        (1..=110).contains(&args.pods) && args.follows <= args.pods && args.secs > 0,
        "need 1 ≤ N ≤ 110 (the node's default --max-pods), F ≤ N and S ≥ 1"
    );
    Ok(args)
}

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let args = parse_args()?;
    ironlet_bin_beside_this()?;
    println!("load average at start: {}", load_average());
    let plane = ControlPlane::up()?;
    let node = "rss-bench-ironlet".to_owned();
    // On the host's address: the API server proxies `kubectl logs` to the node there. The
    // pod network is 10.88.<slot>.0/24 (253 addresses).
    let host_ip = routable_host_ip().context("no routable host address for the node")?;
    let agent = ClusterAgent::start_on(
        &plane.node_kubeconfig(&node)?,
        &node,
        251,
        &["--image-gc-high-threshold=100".as_ref()],
        host_ip,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = run(&rt, &plane, &agent, &node, &args);
    let cleanup = rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, NAMESPACE);
        delete_labelled(&pods, &format!("{LABEL_KEY}={LABEL_VALUE}")).await
    });
    if outcome.is_err() || cleanup.is_err() {
        eprintln!("agent log tail:\n{}", agent.log_tail(40));
    }
    drop(rt);
    drop(agent);
    drop(plane);
    println!("load average at end: {}", load_average());
    outcome.and(cleanup)
}

/// Prints a numbered 100-byte line every 100 ms.
fn pod(name: &str, node: &str) -> Result<Pod> {
    let line = "x".repeat(90);
    busybox_pod(
        name,
        NAMESPACE,
        (LABEL_KEY, LABEL_VALUE),
        node,
        &format!("i=0; while true; do i=$((i+1)); echo \"$i {line}\"; sleep 0.1; done"),
    )
}

/// A process's memory from `/proc/<pid>/status` (KiB; zeros once it is gone): resident in
/// all, of which anonymous (heap, stacks) and file-backed (the binary's pages: large for a
/// debug build), and its threads.
#[derive(Clone, Copy, Default)]
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    threads: u64,
}

impl Memory {
    fn of(pid: i32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0)
        };
        Self {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
            threads: field("Threads:"),
        }
    }

    /// The larger of each figure.
    fn max(self, other: Self) -> Self {
        Self {
            rss: self.rss.max(other.rss),
            anon: self.anon.max(other.anon),
            file: self.file.max(other.file),
            threads: self.threads.max(other.threads),
        }
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB (anon {:.1}, file {:.1}), {} threads",
            mib(self.rss),
            mib(self.anon),
            mib(self.file),
            self.threads
        )
    }
}

/// The agent's pid from its `/version` on the local socket.
fn agent_pid(agent: &ClusterAgent) -> Result<i32> {
    let response = ironlet::server::client::get(&agent.root.join("ironlet.sock"), "/version")
        .context("asking the agent for /version")?;
    let version: serde_json::Value =
        serde_json::from_slice(&response.body).context("the agent's /version")?;
    version["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .context("no pid in the agent's /version")
}

/// One `kubectl logs -f`, its output counted and discarded by a thread.
struct Follower {
    child: Child,
    bytes: Arc<AtomicU64>,
}

impl Follower {
    fn start(plane: &ControlPlane, pod: &str) -> Result<Self> {
        let mut child = plane
            .kubectl_command()
            .args(["logs", "-f", pod])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kubectl logs -f")?;
        let mut stdout = child.stdout.take().context("kubectl's stdout")?;
        let bytes = Arc::new(AtomicU64::new(0));
        let counter = bytes.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        Ok(Self { child, bytes })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn run(
    rt: &tokio::runtime::Runtime,
    plane: &ControlPlane,
    agent: &ClusterAgent,
    node: &str,
    args: &Args,
) -> Result<()> {
    let started = Instant::now();
    rt.block_on(async {
        let client = plane.admin_client().await?;
        wait_node_ready(&client, node).await?;
        let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
        for i in 0..args.pods {
            create_pod(&pods, &pod(&format!("rss-{i}"), node)?).await?;
        }
        let selector = ListParams::default().labels(&format!("{LABEL_KEY}={LABEL_VALUE}"));
        eventually("every pod Running", Duration::from_secs(600), || async {
            let list = pods.list(&selector).await?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            Ok((running == args.pods).then_some(()))
        })
        .await
    })?;
    println!(
        "{} pods Running after {:.1} s; load average {}",
        args.pods,
        started.elapsed().as_secs_f64(),
        load_average()
    );
    std::thread::sleep(Duration::from_secs(10));
    let agent_pid = agent_pid(agent)?;
    let supervisor = agent.supervisor_pid().context("no supervisor")?;
    let before = Memory::of(agent_pid);
    let supervisor_before = Memory::of(supervisor);
    let followers = (0..args.follows)
        .map(|i| Follower::start(plane, &format!("rss-{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mut peak = before;
    let mut supervisor_peak = supervisor_before;
    let deadline = Instant::now() + Duration::from_secs(args.secs);
    while Instant::now() < deadline {
        peak = peak.max(Memory::of(agent_pid));
        supervisor_peak = supervisor_peak.max(Memory::of(supervisor));
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = Memory::of(agent_pid);
    let streamed: Vec<u64> = followers
        .iter()
        .map(|f| f.bytes.load(Ordering::Relaxed))
        .collect();
    drop(followers);
    ensure!(
        streamed.iter().all(|b| *b > 0),
        "a kubectl logs -f received nothing: {streamed:?}"
    );
    println!(
        "{} s of {} kubectl logs -f, {:.1} MB streamed",
        args.secs,
        args.follows,
        streamed.iter().sum::<u64>() as f64 / 1e6
    );
    println!(
        "  agent (pid {agent_pid}), {} pods, before: {before}",
        args.pods
    );
    println!("  agent, peak of each while streaming: {peak}");
    println!("  agent at the end: {after}");
    println!("  supervisor before: {supervisor_before}; peak: {supervisor_peak}");
    Ok(())
}

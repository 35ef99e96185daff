//! Static-pod benchmarks (issue 3), printed as figures:
//!
//! (a) manifest written → pod Running, one pod at a time, p50/p99 over N pods, measured
//!     in-process on the agent's status store (no polling);
//! (b) N manifests written at once into an empty directory → all Running, with the real
//!     `ironlet run` binary, observed over its socket;
//! (c) container exit → PLEG status cache, p50/p99: from the zygote's reap time to the
//!     cache update that follows;
//! (d) resident memory of the agent process (and of its zygote) idle and with N pods.
//!
//! Usage (root): `pod-start [N]` (default 100), with `target/release/ironlet` built
//! (`cargo build --release -p ironlet`). No peer runs here: this machine has no
//! kubelet+containerd to compare with (see docs/BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use ironlet::kubelet::{Kubelet, KubeletConfig};
use ironlet_runtime::image::LocalImageService;
use ironlet_runtime::types::{ContainerConfig, PodSandboxConfig};
use ironlet_runtime::{ImageService, LocalRuntime, LocalRuntimeConfig, Runtime};

use ironlet_bench::stats::{ms, percentile};

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let n = ironlet_bench::count_arg("N", 100)?;
    let images = repo_root().join("images/out/busybox");
    ensure!(images.join("index.json").exists(), "run images/build first");
    let zygote = ironlet_runtime::zygote::spawn()?;
    let rt = ironlet_bench::runtime()?;
    rt.block_on(in_process(zygote, n, &images))?;
    drop(rt);
    with_binary(n, &images)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '3600']\n"
    )
}

async fn in_process(
    zygote: ironlet_runtime::zygote::ZygoteHandle,
    n: usize,
    images: &Path,
) -> Result<()> {
    let root = tempfile::Builder::new().prefix("ironlet-bench").tempdir()?;
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let store = Arc::new(ironlet_runtime::image::ImageStore::open_with(
        &root.path().join("images"),
        Default::default(),
    )?);
    let image_service = Arc::new(LocalImageService::new(store.clone()));
    image_service.import(images).await?;
    let runtime = LocalRuntime::new(
        LocalRuntimeConfig {
            root_dir: root.path().to_owned(),
            rootless: false,
            default_cgroup_parent: None,
            cni: None,
            log_rotation: Default::default(),
        },
        zygote,
        store,
    )
    .await?;
    let runtime = Arc::new(runtime);

    // (c) first, on a bare sandbox: exit → cache.
    let exit_latency = exit_to_cache(runtime.clone(), root.path(), 200).await?;

    let mut config = KubeletConfig::new("bench", root.path());
    config.manifest_path = Some(manifests.clone());
    config.pod_log_dir = root.path().join("logs");
    config.cgroup_root = "/ironlet-bench/kubepods".into();
    let kubelet = Kubelet::start(config, runtime.clone(), image_service).await?;
    let statuses = kubelet.statuses();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(kubelet.run(async move {
        let _ = stopped.await;
    }));

    let mut latencies = Vec::with_capacity(n);
    let mut changes = statuses.subscribe();
    for i in 0..n {
        let name = format!("seq-{i}");
        let tmp = root.path().join(format!(".{name}.yaml"));
        std::fs::write(&tmp, manifest(&name))?;
        let start = Instant::now();
        std::fs::rename(&tmp, manifests.join(format!("{name}.yaml")))?;
        let full = format!("{name}-bench");
        loop {
            let running = statuses.pods().iter().any(|p| {
                p.metadata.name.as_deref() == Some(full.as_str())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            if running {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("pod {name} not Running after 30 s");
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
        }
        latencies.push(start.elapsed());
    }
    latencies.sort();
    println!("(a) manifest → Running, {n} pods one at a time (in-process, status store):");
    println!(
        "    p50 {:.2} ms   p90 {:.2} ms   p99 {:.2} ms   max {:.2} ms",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 90.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0))
    );
    println!(
        "(c) container exit (zygote reap) → PLEG cache, {} exits:",
        exit_latency.len()
    );
    println!(
        "    p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms",
        ms(percentile(&exit_latency, 50.0)),
        ms(percentile(&exit_latency, 99.0)),
        ms(percentile(&exit_latency, 100.0))
    );

    for entry in std::fs::read_dir(&manifests)?.flatten() {
        std::fs::remove_file(entry.path())?;
    }
    let start = Instant::now();
    while !statuses.pods().is_empty() && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    let _ = agent.await;
    Ok(())
}

/// Starts `sh -c true`-like containers in one sandbox and measures, for each exit, the
/// time from the zygote's reap to the PLEG's cache update.
async fn exit_to_cache(
    runtime: Arc<LocalRuntime>,
    root: &Path,
    count: usize,
) -> Result<Vec<Duration>> {
    let cache = Arc::new(ironlet::pod_cache::PodCache::new(runtime.clone()));
    let handles = ironlet::pleg::start(
        runtime.clone(),
        cache.clone(),
        ironlet::pleg::PlegConfig::default(),
        None,
    );
    let (mut events, pleg) = (handles.events, handles.task);
    let sandbox = runtime
        .run_pod_sandbox(&PodSandboxConfig {
            pod_uid: "bench-exit".into(),
            name: "bench-exit".into(),
            namespace: "default".into(),
            log_directory: root.join("logs/bench-exit"),
            ..Default::default()
        })
        .await?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let id = runtime
            .create_container(
                &sandbox,
                &ContainerConfig {
                    name: format!("c{i}"),
                    image: "busybox".into(),
                    command: vec!["true".into()],
                    log_path: format!("c{i}/0.log").into(),
                    ..Default::default()
                },
            )
            .await?;
        runtime.start_container(&id).await?;
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .context("no PLEG event within 10 s")?
            .context("PLEG stopped")?;
        let cached_wall = SystemTime::now() - event.cached_at.elapsed();
        let status = cache
            .get(&event.pod_uid)
            .and_then(|c| c.status.containers.iter().find(|c| c.id == id).cloned())
            .context("the cache has the container")?;
        let finished = status
            .finished_at
            .context("the cached status has the exit")?;
        out.push(cached_wall.duration_since(finished).unwrap_or_default());
        runtime.remove_container(&id).await?;
    }
    runtime.remove_pod_sandbox(&sandbox).await?;
    pleg.abort();
    out.sort();
    Ok(out)
}

/// (b) and (d) with the real binary.
fn with_binary(n: usize, images: &Path) -> Result<()> {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| repo_root().join("target"), PathBuf::from);
    let bin = target.join("release/ironlet");
    ensure!(
        bin.exists(),
        "{} missing: cargo build --release -p ironlet",
        bin.display()
    );
    let root = tempfile::Builder::new().prefix("ironlet-bench").tempdir()?;
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let import = Command::new(&bin)
        .arg("--root-dir")
        .arg(root.path())
        .args(["images", "import"])
        .arg(images)
        .output()?;
    ensure!(
        import.status.success(),
        "import: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    let network = ironlet_runtime::network::DefaultNetwork::default();
    let chain = ironlet_runtime::network::Masquerade::new(&network.name, &network.subnet);
    let masquerade_before = Command::new("iptables")
        .args(["-w", "5", "-t", "nat", "-S", chain.chain()])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut agent = Command::new(&bin)
        .arg("--root-dir")
        .arg(root.path())
        .args([
            "run",
            "--node-name",
            "bench",
            "--cgroup-root",
            "/ironlet-bench2",
        ])
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--pod-logs-dir")
        .arg(root.path().join("logs"))
        // A fresh node's default network, not whatever /etc/cni/net.d holds (and nothing
        // left there pointing into this temporary root).
        .arg("--cni-conf-dir")
        .arg(root.path().join("net.d"))
        // kubelet's disk thresholds may hold on a shared disk: no DiskPressure rejections.
        .arg("--eviction-hard=memory.available<100Mi")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let socket = root.path().join("ironlet.sock");
    let pid = agent.id() as i32;
    let result = (|| -> Result<()> {
        wait(Duration::from_secs(20), || {
            ironlet::server::client::get(&socket, "/healthz").is_ok()
        })?;
        std::thread::sleep(Duration::from_secs(2));
        // `ironlet run` is the supervisor (which is also the zygote); the agent is its child.
        let (idle_agent, idle_zygote) = (agent_rss_kib(pid), rss_kib(pid));
        let start = Instant::now();
        for i in 0..n {
            let tmp = root.path().join(format!(".b{i}"));
            std::fs::write(&tmp, manifest(&format!("burst-{i}")))?;
            std::fs::rename(&tmp, manifests.join(format!("burst-{i}.yaml")))?;
        }
        wait(Duration::from_secs(120), || running_count(&socket) >= n)?;
        let burst = start.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        let (busy_agent, busy_zygote) = (agent_rss_kib(pid), rss_kib(pid));
        println!(
            "(b) {n} manifests into an empty directory → all Running: {:.2} s",
            burst.as_secs_f64()
        );
        println!(
            "(d) RSS idle: agent {:.1} MiB (supervisor+zygote {:.1} MiB); with {n} pods: agent {:.1} MiB (supervisor+zygote {:.1} MiB)",
            idle_agent as f64 / 1024.0,
            idle_zygote as f64 / 1024.0,
            busy_agent as f64 / 1024.0,
            busy_zygote as f64 / 1024.0
        );
        for entry in std::fs::read_dir(&manifests)?.flatten() {
            std::fs::remove_file(entry.path())?;
        }
        wait(Duration::from_secs(120), || pod_count(&socket) == 0)?;
        Ok(())
    })();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = agent.wait();
    if !masquerade_before {
        // The agent's node-wide masquerade rule outlives it by design; this run added it.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(ironlet_runtime::network::remove_masquerade(&network))?;
    }
    result
}

fn wait(timeout: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("timed out after {timeout:?}")
}

fn pods(socket: &Path) -> Vec<k8s_openapi::api::core::v1::Pod> {
    ironlet::server::client::get(socket, "/pods")
        .ok()
        .and_then(|r| {
            serde_json::from_slice::<k8s_openapi::List<k8s_openapi::api::core::v1::Pod>>(&r.body)
                .ok()
        })
        .map(|l| l.items)
        .unwrap_or_default()
}

fn running_count(socket: &Path) -> usize {
    pods(socket)
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

fn pod_count(socket: &Path) -> usize {
    pods(socket).len()
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The agent: the supervisor's largest child (`ironlet run` is the supervisor and zygote).
fn agent_rss_kib(agent: i32) -> u64 {
    let children =
        std::fs::read_to_string(format!("/proc/{agent}/task/{agent}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .map(rss_kib)
        .max()
        .unwrap_or(0)
}

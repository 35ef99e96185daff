//! Density benchmark (issue 14): how many pods one small node carries and what it costs.
//!
//! A real control plane (`scripts/controlplane`), a real `ironlet run --kubeconfig` node and,
//! in the same run, the peer: upstream kubelet + containerd (`scripts/peer-kubelet`). For each
//! N given and each node, one node at a time (the other idle and empty):
//!
//! 1. N static pods (busybox `sleep 3600`, manifests written at once into the node's
//!    manifest directory), then the same with N API pods (POSTed, 16 in flight, bound by
//!    `spec.nodeName`): time from the first write/POST to all N Running, as seen on a watch of
//!    the API (static pods through their mirror pods);
//! 2. at that density, after 10 s of settling: the node's management processes (ironlet:
//!    the supervisor and the agent, every process of its binary; the peer: kubelet,
//!    containerd and every containerd-shim-runc-v2) — summed RSS, their RSS together (distinct
//!    resident pages: a page both map counts once) and summed PSS (PSS splits the pages the
//!    processes share, e.g. ironlet's supervisor and agent run the same binary),
//!    threads, inotify instances and watches; processes in the node's pod cgroup tree, pod
//!    network namespaces, mounts (host-wide and under the node's state directory);
//! 3. CPU used by the management processes while idle at that density (utime + stime over
//!    the idle window), in % of one core;
//! 4. pod start of one extra API pod at that density, several times one after the other
//!    (POST → Running on the watch), p50, against the same on the empty node (measured once
//!    per node first).
//!
//! Everything is removed after each step (manifests and API pods deleted and awaited, the
//! node's pod cgroup tree empty), then at the end the peer's `down`, the agent stopped with its
//! mounts/bridge/cgroups removed, the control plane `down`.
//!
//! Usage (root): `density N... [--no-peer] [--peer-max=N] [--idle-secs=S] [--extra=K]
//! [--static-only | --api-only]` (default `density 110`, peer for N ≤ `--peer-max`, 250 by
//! default; 60 s idle; 15 extra pods: the p50 of 7 or 9 moved by a quarter from run to run
//! on this 2-core machine), with `ironlet` beside this binary or `IRONLET_BIN`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures_util::StreamExt;
use ironlet_bench::cluster::{
    ironlet_bin_beside_this, load_average, sleep_pod, teardown, wait_node_ready, PodWatch, Seen,
};
use ironlet_bench::peer_node::PeerNode;
use ironlet_bench::stats::{ms, percentile};
use ironlet_e2e::{eventually, pids_in_tree, ClusterAgent, ControlPlane};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const LABEL: &str = "ironlet-bench=density";
const NAMESPACE: &str = "default";
const IRONLET_SUBNET: &str = "10.92.0.0/22";
const PEER_SUBNET: &str = "10.89.0.0/22";
const IN_FLIGHT: usize = 16;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Static,
    Api,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Static => "static",
            Mode::Api => "api",
        }
    }
}

struct Args {
    sizes: Vec<usize>,
    peer: bool,
    peer_max: usize,
    idle: Duration,
    extra: usize,
    modes: Vec<Mode>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        sizes: Vec::new(),
        peer: true,
        peer_max: 250,
        idle: Duration::from_secs(60),
        extra: 15,
        modes: vec![Mode::Static, Mode::Api],
    };
    for arg in std::env::args().skip(1) {
        let number = |prefix: &str| -> Result<u64> {
            let v = &arg[prefix.len()..];
            v.parse()
                .with_context(|| format!("{prefix} takes a number: {v}"))
        };
        match arg.as_str() {
            "--no-peer" => args.peer = false,
            "--static-only" => args.modes = vec![Mode::Static],
            "--api-only" => args.modes = vec![Mode::Api],
            s if s.starts_with("--peer-max=") => args.peer_max = number("--peer-max=")? as usize,
            s if s.starts_with("--idle-secs=") => {
                args.idle = Duration::from_secs(number("--idle-secs=")?)
            }
            s if s.starts_with("--extra=") => args.extra = number("--extra=")? as usize,
            n => args.sizes.push(
                n.parse()
                    .with_context(|| format!("N must be a number: {n}"))?,
            ),
        }
    }
    if args.sizes.is_empty() {
        args.sizes.push(110);
    }
    ensure!(args.extra > 0, "--extra must be at least 1");
    Ok(args)
}

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let args = parse_args()?;
    // Before any thread exists: ClusterAgent reads it.
    ironlet_bin_beside_this()?;
    println!("load average at start: {}", load_average());
    println!("{}", limits());
    let largest = args.sizes.iter().copied().max().unwrap_or(0) + args.extra + 10;
    let peer_sizes = args.sizes.iter().filter(|n| **n <= args.peer_max);
    let peer_largest = peer_sizes.copied().max();
    // Dropped in reverse order: peer, agent, control plane.
    let plane = ControlPlane::up()?;
    let max_pods = format!("--max-pods={largest}");
    let agent = ClusterAgent::start_on_subnet(
        &plane.node_kubeconfig("bench-ironlet")?,
        "bench-ironlet",
        210,
        // The shared disk may be above the 85 % image GC threshold: busybox (pull policy
        // Never) would be removed whenever no pod uses it, between two steps.
        &[max_pods.as_ref(), "--image-gc-high-threshold=100".as_ref()],
        IRONLET_SUBNET,
    )?;
    let peer = match (args.peer, peer_largest) {
        (true, Some(n)) => Some(PeerNode::up_with(
            &plane,
            "bench-kubelet",
            &[
                ("IRONLET_PEER_MAX_PODS", (n + args.extra + 10).to_string()),
                ("IRONLET_PEER_SUBNET", PEER_SUBNET.to_owned()),
            ],
        )?),
        _ => None,
    };
    let mut nodes = vec![Target::ironlet(&agent)?];
    if let Some(peer) = &peer {
        nodes.push(Target::kubelet(peer));
    }
    let rt = ironlet_bench::runtime()?;
    let outcome = rt.block_on(run(&plane, &nodes, &args));
    let cleanup = rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, NAMESPACE);
        for node in &nodes {
            clear(&pods, node).await?;
        }
        Ok::<_, anyhow::Error>(())
    });
    teardown(rt, plane, agent, peer, outcome, cleanup)
}

/// One node under test: where its manifests go, which processes are its management
/// processes, where its pods' processes are.
struct Target {
    name: String,
    manifests: PathBuf,
    state_dir: PathBuf,
    pods_cgroup: PathBuf,
    kind: Kind,
}

enum Kind {
    /// Every process running this binary (the supervisor and the agent).
    Ironlet { binary: PathBuf },
    /// kubelet, containerd and its shims of the peer in this state directory.
    Kubelet,
}

impl Target {
    fn ironlet(agent: &ClusterAgent) -> Result<Self> {
        ensure!(agent.supervisor_pid().is_some(), "the agent is not running");
        Ok(Self {
            name: agent.node_name.clone(),
            manifests: agent.manifests.clone(),
            state_dir: agent.root.clone(),
            pods_cgroup: pids_cgroup(agent.cgroup_root()),
            kind: Kind::Ironlet {
                binary: agent.root.join("ironlet"),
            },
        })
    }

    fn kubelet(peer: &PeerNode) -> Self {
        Self {
            name: peer.node.clone(),
            manifests: peer.dir().join("manifests"),
            state_dir: peer.dir().to_owned(),
            pods_cgroup: pids_cgroup("/ironlet-peer"),
            kind: Kind::Kubelet,
        }
    }

    fn short(&self) -> &str {
        self.name.strip_prefix("bench-").unwrap_or(&self.name)
    }

    /// The management processes' pids.
    fn processes(&self) -> Vec<i32> {
        let state = self.state_dir.to_string_lossy().into_owned();
        all_pids()
            .into_iter()
            .filter(|pid| {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                match &self.kind {
                    Kind::Ironlet { binary } => &exe == binary,
                    Kind::Kubelet => {
                        let file = exe.file_name().map(|f| f.to_string_lossy().into_owned());
                        matches!(
                            file.as_deref(),
                            Some("kubelet" | "containerd" | "containerd-shim-runc-v2")
                        ) && std::fs::read(format!("/proc/{pid}/cmdline"))
                            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&state))
                    }
                }
            })
            .collect()
    }
}

fn pids_cgroup(root: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/pids").join(root.trim_start_matches('/'))
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// A `/proc/PID/status` field in kB (or a count), 0 when absent.
fn status_field(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The processes' resident set taken together: their distinct physical pages, from
/// `/proc/PID/pagemap` (frame numbers need root; 0 without them). A page several of them map
/// counts once (ironlet's supervisor and agent run one binary; the peer's shims share
/// theirs), where the RSS sum counts it in each and PSS also splits with every other
/// process of the host what they share with it (libc).
fn distinct_resident_kib(pids: &[i32]) -> u64 {
    use std::io::{Read as _, Seek as _, SeekFrom};
    const PRESENT: u64 = 1 << 63;
    const FRAME: u64 = (1 << 55) - 1;
    /// Pagemap entries read at a time (of 8 bytes each).
    const CHUNK: u64 = 1 << 15;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64);
    let mut frames = std::collections::HashSet::new();
    let mut buf = vec![0u8; (CHUNK * 8) as usize];
    for pid in pids {
        let (Ok(maps), Ok(mut pagemap)) = (
            std::fs::read_to_string(format!("/proc/{pid}/maps")),
            std::fs::File::open(format!("/proc/{pid}/pagemap")),
        ) else {
            continue;
        };
        let ranges = maps.lines().filter_map(|l| {
            let (from, to) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(from, 16).ok()? / page,
                u64::from_str_radix(to, 16).ok()? / page,
            ))
        });
        for (mut first, end) in ranges {
            while first < end {
                let n = (end - first).min(CHUNK);
                let bytes = &mut buf[..(n * 8) as usize];
                // [vsyscall] lies beyond what pagemap serves.
                if pagemap.seek(SeekFrom::Start(first * 8)).is_err()
                    || pagemap.read_exact(bytes).is_err()
                {
                    break;
                }
                frames.extend(
                    bytes
                        .chunks_exact(8)
                        .filter_map(|e| <[u8; 8]>::try_from(e).ok())
                        .map(u64::from_le_bytes)
                        .filter(|e| e & PRESENT != 0 && e & FRAME != 0)
                        .map(|e| e & FRAME),
                );
                first += n;
            }
        }
    }
    frames.len() as u64 * page / 1024
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// (inotify instances, inotify watches) held by `pid`.
fn inotify(pid: i32) -> (u64, u64) {
    let mut instances = 0;
    let mut watches = 0;
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        if target.to_string_lossy() != "anon_inode:inotify" {
            continue;
        }
        instances += 1;
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        watches += info
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count() as u64;
    }
    (instances, watches)
}

fn mount_count(under: Option<&Path>) -> usize {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let under = under.map(|p| p.to_string_lossy().into_owned());
    mounts
        .lines()
        .filter(|l| {
            under.as_ref().is_none_or(|u| {
                l.split_whitespace()
                    .nth(4)
                    .is_some_and(|m| m.starts_with(u))
            })
        })
        .count()
}

fn net_namespaces(pids: &[i32]) -> usize {
    let host = std::fs::read_link("/proc/1/ns/net").unwrap_or_default();
    pids.iter()
        .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok())
        .filter(|ns| *ns != host)
        .collect::<BTreeSet<_>>()
        .len()
}

/// What a node uses at a density.
#[derive(Default)]
struct Footprint {
    processes: usize,
    rss_kib: u64,
    /// Distinct resident pages of all of them ([`distinct_resident_kib`]).
    together_kib: u64,
    pss_kib: u64,
    threads: u64,
    inotify_instances: u64,
    inotify_watches: u64,
    pod_processes: usize,
    netns: usize,
    mounts_host: usize,
    mounts_under_state: usize,
}

fn footprint(node: &Target) -> Footprint {
    let processes = node.processes();
    let pods = pids_in_tree(&node.pods_cgroup);
    let mut f = Footprint {
        processes: processes.len(),
        pod_processes: pods.len(),
        netns: net_namespaces(&pods),
        mounts_host: mount_count(None),
        mounts_under_state: mount_count(Some(&node.state_dir)),
        ..Default::default()
    };
    f.together_kib = distinct_resident_kib(&processes);
    for pid in processes {
        f.rss_kib += status_field(pid, "VmRSS:");
        f.threads += status_field(pid, "Threads:");
        f.pss_kib += pss_kib(pid);
        let (i, w) = inotify(pid);
        f.inotify_instances += i;
        f.inotify_watches += w;
    }
    f
}

/// CPU used by the node's management processes over `window`, in % of one core.
async fn idle_cpu(node: &Target, window: Duration) -> f64 {
    let before: HashMap<i32, u64> = node
        .processes()
        .into_iter()
        .filter_map(|p| Some((p, cpu_ticks(p)?)))
        .collect();
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = start.elapsed().as_secs_f64();
    let ticks: u64 = before
        .iter()
        .filter_map(|(pid, t0)| Some(cpu_ticks(*pid)?.saturating_sub(*t0)))
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks as f64 / hz / elapsed * 100.0
}

/// The host limits that bound density.
fn limits() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "?".into())
    };
    format!(
        "limits: kernel.pid_max {} · kernel.threads-max {} · fs.inotify.max_user_instances {} · \
         fs.inotify.max_user_watches {} · fs.mount-max {} · user.max_net_namespaces {} · \
         Linux bridge ports 1024 (BR_MAX_PORTS) · pod subnet {IRONLET_SUBNET} (ironlet), \
         {PEER_SUBNET} (peer)",
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
        read("/proc/sys/fs/inotify/max_user_instances"),
        read("/proc/sys/fs/inotify/max_user_watches"),
        read("/proc/sys/fs/mount-max"),
        read("/proc/sys/user/max_net_namespaces"),
    )
}

/// Waits until `count` pods whose names start with `prefix` are Running; returns the latest
/// first-Running stamp among them.
async fn wait_running(
    watch: &mut PodWatch,
    prefix: &str,
    count: usize,
    timeout: Duration,
) -> Result<Instant> {
    let running = |seen: &Seen| -> Vec<Instant> {
        seen.iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter_map(|(_, stamps)| stamps.running)
            .collect()
    };
    let last = watch
        .wait_until(
            timeout,
            &format!("{prefix}*"),
            |seen| {
                let stamps = running(seen);
                (stamps.len() >= count).then(|| stamps.iter().max().copied())
            },
            |seen| {
                let running = running(seen).len();
                format!("{running} of {count} pods {prefix}* Running after {timeout:?}")
            },
        )
        .await?;
    last.context("no pod")
}

fn pod_json(name: &str, node: Option<&str>) -> serde_json::Value {
    sleep_pod(name, NAMESPACE, "density", node)
}

struct Ctx<'a> {
    pods: Api<Pod>,
    /// First sightings of each density pod Running; forgotten when the pod is deleted.
    watch: PodWatch,
    args: &'a Args,
}

/// Pod start of `count` API pods one after the other on `node` (kept running), sorted.
async fn extra_pods(ctx: &mut Ctx<'_>, node: &Target, tag: &str) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(ctx.args.extra);
    for i in 0..ctx.args.extra {
        let name = format!("{}-{tag}-{i}", node.short());
        let pod: Pod = serde_json::from_value(pod_json(&name, Some(&node.name)))?;
        // The first pod of the run waits for the default ServiceAccount to exist.
        let give_up = Instant::now() + Duration::from_secs(60);
        let posted = loop {
            let posted = Instant::now();
            match ctx.pods.create(&PostParams::default(), &pod).await {
                Ok(_) => break posted,
                Err(err) if Instant::now() > give_up => {
                    return Err(err).with_context(|| format!("creating {name}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let running = wait_running(&mut ctx.watch, &name, 1, Duration::from_secs(60)).await?;
        out.push(running.saturating_duration_since(posted));
    }
    out.sort();
    Ok(out)
}

/// Removes every density pod of `node` (manifests, then API pods) and waits until the API
/// has none left and the node's pod cgroup tree has no process.
async fn clear(pods: &Api<Pod>, node: &Target) -> Result<()> {
    if let Ok(entries) = std::fs::read_dir(&node.manifests) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let list = ListParams::default()
        .labels(LABEL)
        .fields(&format!("spec.nodeName={}", node.name));
    pods.delete_collection(&DeleteParams::default().grace_period(1), &list)
        .await
        .context("deleting the density pods")?;
    eventually(
        &format!("no density pod left on {}", node.name),
        Duration::from_secs(300),
        || async {
            let left = pods.list(&list).await?.items.is_empty();
            Ok((left && pids_in_tree(&node.pods_cgroup).is_empty()).then_some(()))
        },
    )
    .await
}

/// Writes N manifests or POSTs N pods; returns the time to all Running.
async fn fill(ctx: &mut Ctx<'_>, node: &Target, mode: Mode, n: usize) -> Result<Duration> {
    let prefix = format!("{}-{}-", node.short(), mode.name());
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let start = Instant::now();
    match mode {
        Mode::Static => {
            let staging = node.state_dir.join(".density-staging");
            std::fs::create_dir_all(&staging)?;
            for name in &names {
                let tmp = staging.join(format!("{name}.yaml"));
                std::fs::write(&tmp, pod_json(name, None).to_string())?;
                std::fs::rename(&tmp, node.manifests.join(format!("{name}.yaml")))?;
            }
            std::fs::remove_dir(&staging)?;
        }
        Mode::Api => {
            let specs = names
                .iter()
                .map(|name| serde_json::from_value::<Pod>(pod_json(name, Some(&node.name))))
                .collect::<Result<Vec<_>, _>>()?;
            let pods = &ctx.pods;
            let results: Vec<_> = futures_util::stream::iter(specs.iter())
                .map(|pod| async move { pods.create(&PostParams::default(), pod).await })
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
            for result in results {
                result.context("creating a density pod")?;
            }
        }
    }
    let last = wait_running(&mut ctx.watch, &prefix, n, Duration::from_secs(900)).await?;
    Ok(last.saturating_duration_since(start))
}

/// Figures of one node at one density in one mode.
struct Row {
    node: String,
    mode: Mode,
    n: usize,
    all_running: Duration,
    footprint: Footprint,
    idle_cpu: f64,
    extra_p50: Duration,
    empty_p50: Duration,
}

async fn run(plane: &ControlPlane, nodes: &[Target], args: &Args) -> Result<()> {
    let client = plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for node in nodes {
        wait_node_ready(&client, &node.name).await?;
    }
    let watch = PodWatch::start(pods.clone(), LABEL).await?;
    let mut ctx = Ctx { pods, watch, args };
    measure(&mut ctx, nodes).await
}

async fn measure(ctx: &mut Ctx<'_>, nodes: &[Target]) -> Result<()> {
    let args = ctx.args;
    // Pod start on the empty node, once per node.
    let mut empty = Vec::with_capacity(nodes.len());
    for node in nodes {
        let samples = extra_pods(ctx, node, "empty").await?;
        clear(&ctx.pods, node).await?;
        let idle = footprint(node);
        println!(
            "{}: empty node: pod start p50 {:.1} ms (max {:.1} ms, {} pods); {} processes, RSS {:.1} MiB (together {:.1}), PSS {:.1} MiB",
            node.short(),
            ms(percentile(&samples, 50.0)),
            ms(percentile(&samples, 100.0)),
            samples.len(),
            idle.processes,
            mib(idle.rss_kib),
            mib(idle.together_kib),
            mib(idle.pss_kib),
        );
        empty.push(percentile(&samples, 50.0));
    }
    let mut rows = Vec::new();
    for &n in &args.sizes {
        for &mode in &args.modes {
            for (node, empty_p50) in nodes.iter().zip(&empty) {
                if node.name != nodes[0].name && n > args.peer_max {
                    continue;
                }
                println!(
                    "{} {} N={n}: filling (load average {})",
                    node.short(),
                    mode.name(),
                    load_average()
                );
                let row = at_density(ctx, node, mode, n, *empty_p50).await;
                let cleared = clear(&ctx.pods, node).await;
                let row = row?;
                cleared?;
                print_row(&row);
                rows.push(row);
            }
        }
    }
    println!(
        "\nSummary ({} s idle window, {} extra pods; RSS/PSS: sum over the management processes; \
         RSS∪: their distinct resident pages)",
        args.idle.as_secs(),
        args.extra
    );
    println!(
        "  {:<8} {:<6} {:>4} {:>9} {:>5} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>6} {:>7} {:>6} {:>8} {:>7} {:>7}",
        "node", "mode", "N", "allRun s", "procs", "RSS MiB", "RSS∪ MiB", "PSS MiB", "threads", "CPU %", "x p50ms", "x/empt",
        "podproc", "netns", "mounts+", "in-root", "inotify"
    );
    for r in &rows {
        let f = &r.footprint;
        println!(
            "  {:<8} {:<6} {:>4} {:>9.2} {:>5} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>8.3} {:>8.1} {:>6.2} {:>7} {:>6} {:>8} {:>7} {:>3}/{:<4}",
            r.node, r.mode.name(), r.n, r.all_running.as_secs_f64(), f.processes, mib(f.rss_kib), mib(f.together_kib), mib(f.pss_kib),
            f.threads, r.idle_cpu, ms(r.extra_p50), ms(r.extra_p50) / ms(r.empty_p50).max(0.001),
            f.pod_processes, f.netns, f.mounts_host, f.mounts_under_state, f.inotify_instances, f.inotify_watches
        );
    }
    for ir in rows.iter().filter(|r| r.node == nodes[0].short()) {
        let Some(kr) = rows
            .iter()
            .find(|k| k.node != ir.node && k.n == ir.n && k.mode == ir.mode)
        else {
            continue;
        };
        println!(
            "  ratio ironlet/kubelet {} N={}: all Running {:.2} · RSS {:.3} · RSS∪ {:.3} · PSS {:.3} · idle CPU {:.3} · extra pod p50 {:.2}",
            ir.mode.name(),
            ir.n,
            ir.all_running.as_secs_f64() / kr.all_running.as_secs_f64(),
            ir.footprint.rss_kib as f64 / kr.footprint.rss_kib.max(1) as f64,
            ir.footprint.together_kib as f64 / kr.footprint.together_kib.max(1) as f64,
            ir.footprint.pss_kib as f64 / kr.footprint.pss_kib.max(1) as f64,
            ir.idle_cpu / kr.idle_cpu.max(0.0001),
            ms(ir.extra_p50) / ms(kr.extra_p50).max(0.001),
        );
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn at_density(
    ctx: &mut Ctx<'_>,
    node: &Target,
    mode: Mode,
    n: usize,
    empty_p50: Duration,
) -> Result<Row> {
    let mounts_before = mount_count(None);
    let all_running = fill(ctx, node, mode, n).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut footprint = footprint(node);
    footprint.mounts_host = footprint.mounts_host.saturating_sub(mounts_before);
    let idle_cpu = idle_cpu(node, ctx.args.idle).await;
    let extra = extra_pods(ctx, node, &format!("x{}", mode.name())).await?;
    Ok(Row {
        node: node.short().to_owned(),
        mode,
        n,
        all_running,
        footprint,
        idle_cpu,
        extra_p50: percentile(&extra, 50.0),
        empty_p50,
    })
}

fn print_row(r: &Row) {
    let f = &r.footprint;
    println!(
        "  {} {} N={}: all Running {:.2} s · {} processes RSS {:.1} MiB (together {:.1}) PSS {:.1} MiB, {} threads · idle CPU {:.3} % of a core · \
         extra pod p50 {:.1} ms ({:.2}× empty {:.1} ms) · pod processes {} · netns {} · mounts +{} host-wide, {} under state dir · inotify {} instances {} watches",
        r.node, r.mode.name(), r.n, r.all_running.as_secs_f64(), f.processes, mib(f.rss_kib), mib(f.together_kib), mib(f.pss_kib), f.threads,
        r.idle_cpu, ms(r.extra_p50), ms(r.extra_p50) / ms(r.empty_p50).max(0.001), ms(r.empty_p50),
        f.pod_processes, f.netns, f.mounts_host, f.mounts_under_state, f.inotify_instances, f.inotify_watches
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame numbers need root: without them there is nothing to count.
    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn a_page_two_processes_share_counts_once_together() -> Result<()> {
        if !root() {
            eprintln!("skipped: pagemap frame numbers need root");
            return Ok(());
        }
        // Two processes of one binary, as ironlet's supervisor and agent are: its text and
        // libc's are the same page-cache pages in both.
        let mut a = std::process::Command::new("sleep").arg("30").spawn()?;
        let mut b = std::process::Command::new("sleep").arg("30").spawn()?;
        let (pa, pb) = (a.id() as i32, b.id() as i32);
        std::thread::sleep(Duration::from_millis(200));
        let (alone_a, alone_b) = (distinct_resident_kib(&[pa]), distinct_resident_kib(&[pb]));
        let rss_a = status_field(pa, "VmRSS:");
        let twice = distinct_resident_kib(&[pa, pa]);
        let together = distinct_resident_kib(&[pa, pb]);
        for child in [&mut a, &mut b] {
            child.kill()?;
            child.wait()?;
        }
        ensure!(alone_a > 0, "nothing counted");
        ensure!(
            alone_a.abs_diff(rss_a) * 10 <= rss_a,
            "{alone_a} KiB against VmRSS {rss_a} KiB"
        );
        ensure!(
            twice == alone_a,
            "one process twice: {twice} against {alone_a} KiB"
        );
        ensure!(
            together >= alone_a.max(alone_b) && together < alone_a + alone_b,
            "{together} KiB together, {alone_a} + {alone_b} KiB apart"
        );
        Ok(())
    }
}

//! API pod start latency (issue 4): a real control plane (`scripts/controlplane`), a real
//! `ironlet run --kubeconfig` node and, as the peer in the same run, an upstream kubelet +
//! containerd node (`scripts/peer-kubelet`). For each pod: POST of a pod bound by
//! `spec.nodeName` (busybox `sleep 3600`, image present, `restartPolicy: Always`) → the first
//! watch event showing phase Running, and the first showing the Ready condition True. The
//! watch is opened (and synced) before the first POST; events are stamped when received.
//!
//! Sequential mode: one pod at a time, nodes interleaved round by round (the order flips each
//! round), pods left running so the nodes fill up. `--burst`: afterwards, per node, N pods
//! POSTed at once; per-pod latency from its own POST and the time to all Running.
//!
//! `--pull` (issue 12): instead, N rounds of a pod whose image is not on the node: the
//! `layered` test image (busybox plus three small layers) only in a loopback registry
//! (Debian's `docker-registry`, TLS from a test CA: ironlet trusts it through
//! `--registry-config`, containerd's CRI through a hosts directory), `IfNotPresent`. Before
//! each pod the image is removed from its node (ironlet: `images rm` + `images prune`;
//! containerd: `ctr -n k8s.io images rm --sync` of every name of the image, whose garbage
//! collection removes its content and snapshots) and checked gone; after it is Running and
//! Ready the pod is deleted and awaited. Nodes interleaved, the order flipping each round;
//! the layer both nodes already have (busybox's) is not fetched by either.
//! `--pull=debian`: the same with the ~200 MB image of `image-pull` (10 gzip layers of the
//! host's Debian package files, `debian_image::build_runnable_layout`: its bottom layer makes
//! `sleep` runnable), built at start; no layer of it is on either node.
//!
//! Usage (root): `api-pod-start [N] [--burst | --pull[=layered|debian]] [--no-peer | --peer-idle]
//! [--settle-ms=MS]` (N defaults to 50; `--peer-idle`: the peer node runs but gets no pods;
//! `--settle-ms`: idle time after each sequential pod, 0 by default), with
//! `ironlet` built beside this binary (`cargo build --release -p ironlet -p ironlet-bench`)
//! and, for the peer, `scripts/peer-kubelet build` done once. Teardown (always, also after a
//! failure): every bench pod deleted and awaited, the peer's `down`, the agent stopped with
//! its mounts/bridge/cgroups removed, the control plane `down`.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_e2e::{eventually, images_out, ironlet_binary, ClusterAgent, ControlPlane};
use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use ironlet_bench::cluster::{
    delete_all_labelled, delete_labelled, describe_node, ironlet_bin_beside_this, load_average,
    sleep_pod, teardown, wait_node_ready, PodStamps, PodWatch,
};
use ironlet_bench::debian_image::{build_runnable_layout, LAYERS};
use ironlet_bench::peer_node::PeerNode;
use ironlet_bench::registry_hosts::write_hosts_dir;
use ironlet_bench::stats::{ms, percentile};

const LABEL: &str = "ironlet-bench=api-pod-start";
const NAMESPACE: &str = "default";
const POD_TIMEOUT: Duration = Duration::from_secs(60);
/// The `--pull` image's repository and tag in the registry.
const PULL_REPO_TAG: &str = "bench/pull:1";
/// The `--pull=debian` image's.
const DEBIAN_REPO_TAG: &str = "bench/debian:1";

/// Which image `--pull` pulls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PullImage {
    /// `layered`: busybox plus three small layers.
    Layered,
    /// The ~200 MB image of Debian package files.
    Debian,
}

struct Args {
    n: usize,
    burst: bool,
    peer: bool,
    /// The peer node runs but gets no pods (its idle cost on ironlet's figures).
    peer_idle: bool,
    /// Idle time after each sequential pod, before the next POST.
    settle: Duration,
    /// Pods of an image not present on the node, pulled from a loopback registry.
    pull: Option<PullImage>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        n: 50,
        burst: false,
        peer: true,
        peer_idle: false,
        settle: Duration::ZERO,
        pull: None,
    };
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--burst" => args.burst = true,
            "--pull" | "--pull=layered" => args.pull = Some(PullImage::Layered),
            "--pull=debian" => args.pull = Some(PullImage::Debian),
            "--no-peer" => args.peer = false,
            "--peer-idle" => args.peer_idle = true,
            s if s.starts_with("--settle-ms=") => {
                let ms = &s["--settle-ms=".len()..];
                args.settle = Duration::from_millis(
                    ms.parse()
                        .with_context(|| format!("--settle-ms must be a number: {ms}"))?,
                );
            }
            n => {
                args.n = n
                    .parse()
                    .with_context(|| format!("N must be a number: {n}"))?
            }
        }
    }
    ensure!(args.n > 0, "N must be at least 1");
    ensure!(
        !(args.pull.is_some() && args.burst),
        "--pull and --burst are separate runs"
    );
    Ok(args)
}

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let args = parse_args()?;
    // Before any thread exists: ClusterAgent reads it.
    ironlet_bin_beside_this()?;
    println!("load average at start: {}", load_average());
    // The --pull registry and its trust for both nodes (removed last).
    let work = tempfile::Builder::new()
        .prefix("ironlet-bench-api-pull-")
        .tempdir()?;
    let registry = match args.pull {
        Some(image) => Some(start_registry(image, work.path())?),
        None => None,
    };
    let mut agent_args: Vec<std::ffi::OsString> = Vec::new();
    let mut peer_env: Vec<(&str, String)> = Vec::new();
    if let Some((registry, _)) = &registry {
        let config = work.path().join("registries.yaml");
        std::fs::write(
            &config,
            format!(
                "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
                registry.host(),
                registry.ca_file().display()
            ),
        )?;
        agent_args.extend(["--registry-config".into(), config.into_os_string()]);
        let hosts = write_hosts_dir(work.path(), registry)?;
        peer_env.push((
            "IRONLET_PEER_REGISTRY_HOSTS_DIR",
            hosts.to_string_lossy().into_owned(),
        ));
    }
    // Dropped in reverse order: peer, agent, control plane.
    let plane = ControlPlane::up()?;
    let ironlet_node = "bench-ironlet".to_owned();
    let agent_args: Vec<&std::ffi::OsStr> = agent_args.iter().map(|a| a.as_os_str()).collect();
    let agent = ClusterAgent::start_with_args(
        &plane.node_kubeconfig(&ironlet_node)?,
        &ironlet_node,
        200,
        &agent_args,
    )?;
    let peer = if args.peer {
        Some(PeerNode::up_with(&plane, "bench-kubelet", &peer_env)?)
    } else {
        None
    };
    let pull = registry.as_ref().map(|(r, repo_tag)| PullSetup {
        reference: format!("{}/{repo_tag}", r.host()),
        ironlet_root: agent.root.clone(),
        peer: peer.as_ref().map(|p| {
            (
                p.bin.join("ctr"),
                p.dir().join("containerd.sock"),
                p.node.clone(),
            )
        }),
    });
    let mut nodes = vec![ironlet_node];
    if let Some(peer) = &peer {
        nodes.push(peer.node.clone());
    }
    let rt = ironlet_bench::runtime()?;
    let measured = if args.peer_idle {
        &nodes[..1]
    } else {
        &nodes[..]
    };
    let outcome = rt.block_on(run(&plane, measured, &args, pull.as_ref()));
    let cleanup = rt.block_on(delete_all_labelled(&plane, NAMESPACE, LABEL));
    let result = teardown(rt, plane, agent, peer, outcome, cleanup);
    drop(registry);
    drop(work);
    result
}

/// A loopback registry holding `image`; returns it and the image's `repo:tag` there.
fn start_registry(
    image: PullImage,
    work: &std::path::Path,
) -> Result<(TestRegistry, &'static str)> {
    let registry = TestRegistry::start(RegistryOptions::default())?;
    let repo_tag = match image {
        PullImage::Layered => {
            registry.push(&images_out()?.join("layered"), PULL_REPO_TAG, &[])?;
            PULL_REPO_TAG
        }
        PullImage::Debian => {
            let layout = work.join("debian-layout");
            let sizes = build_runnable_layout(&layout, LAYERS, DEBIAN_REPO_TAG)?;
            println!(
                "image: {} gzip layers, {:.1} MB unpacked, {:.1} MB compressed",
                sizes.layers,
                sizes.unpacked as f64 / 1e6,
                sizes.compressed as f64 / 1e6
            );
            registry.push(&layout, DEBIAN_REPO_TAG, &[])?;
            std::fs::remove_dir_all(&layout).context("removing the layout")?;
            DEBIAN_REPO_TAG
        }
    };
    Ok((registry, repo_tag))
}

#[derive(Clone, Copy)]
struct Sample {
    running: Duration,
    ready: Duration,
}

/// What `--pull` needs: the image's reference and how to remove it from each node.
struct PullSetup {
    reference: String,
    /// The agent's `--root-dir` (`ironlet images rm/prune` there).
    ironlet_root: std::path::PathBuf,
    /// The peer's `ctr`, containerd socket and node name.
    peer: Option<(std::path::PathBuf, std::path::PathBuf, String)>,
}

async fn run(
    plane: &ControlPlane,
    nodes: &[String],
    args: &Args,
    pull: Option<&PullSetup>,
) -> Result<()> {
    let client = plane.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for node in nodes {
        wait_node_ready(&client, node).await?;
        println!("{}", describe_node(&client, node).await?);
    }
    // The watch is opened (and synced) before the first POST.
    let mut watch = PodWatch::start(pods.clone(), LABEL).await?;
    measure(&pods, nodes, args, pull, &mut watch).await
}

async fn measure(
    pods: &Api<Pod>,
    nodes: &[String],
    args: &Args,
    pull: Option<&PullSetup>,
    watch: &mut PodWatch,
) -> Result<()> {
    // Warm-up, not measured: the first pod waits for the default ServiceAccount to exist.
    for node in nodes {
        let name = format!("{}-warmup", short(node));
        eventually("the warm-up pod is created", POD_TIMEOUT, || async {
            pods.create(&PostParams::default(), &pod(&name, node)?)
                .await?;
            Ok(Some(()))
        })
        .await?;
        wait_stamps(watch, &name).await?;
    }
    if let Some(pull) = pull {
        return measure_pull(pods, nodes, args.n, pull, watch).await;
    }
    let mut sequential: Vec<Vec<Sample>> = vec![Vec::with_capacity(args.n); nodes.len()];
    for round in 0..args.n {
        for k in 0..nodes.len() {
            let k = if round % 2 == 0 {
                k
            } else {
                nodes.len() - 1 - k
            };
            let node = &nodes[k];
            let name = format!("{}-seq-{round}", short(node));
            let pod = pod(&name, node)?;
            let posted = Instant::now();
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("creating {name}"))?;
            let stamps = wait_stamps(watch, &name).await?;
            sequential[k].push(sample(posted, stamps)?);
            tokio::time::sleep(args.settle).await;
        }
    }
    println!(
        "\nSequential: {} pods per node, one at a time ({} ms idle after each), \
         POST → watch event (ms)",
        args.n,
        args.settle.as_millis()
    );
    report(nodes, &sequential);
    println!("load average after the sequential pods: {}", load_average());
    if args.burst {
        delete_labelled(pods, LABEL).await?;
        let mut burst = Vec::with_capacity(nodes.len());
        let mut totals = Vec::with_capacity(nodes.len());
        for node in nodes {
            let (samples, total) = run_burst(pods, node, args.n, watch).await?;
            burst.push(samples);
            totals.push(total);
            delete_labelled(pods, LABEL).await?;
        }
        println!(
            "\nBurst: {} pods POSTed at once per node (nodes one after the other), \
             each pod's POST → watch event (ms)",
            args.n
        );
        report(nodes, &burst);
        for (node, total) in nodes.iter().zip(&totals) {
            println!(
                "  {:<8} first POST → all {} Running: {:.0} ms",
                short(node),
                args.n,
                ms(*total)
            );
        }
        if totals.len() == 2 {
            println!(
                "  ratio ironlet/kubelet (all Running): {:.2}",
                ms(totals[0]) / ms(totals[1])
            );
        }
        println!("load average after the bursts: {}", load_average());
    }
    Ok(())
}

async fn run_burst(
    pods: &Api<Pod>,
    node: &str,
    n: usize,
    watch: &mut PodWatch,
) -> Result<(Vec<Sample>, Duration)> {
    let names: Vec<String> = (0..n)
        .map(|i| format!("{}-burst-{i}", short(node)))
        .collect();
    let specs = names
        .iter()
        .map(|name| pod(name, node))
        .collect::<Result<Vec<_>>>()?;
    let first = Instant::now();
    let posts = specs.iter().map(|pod| async move {
        pods.create(&PostParams::default(), pod).await?;
        Ok::<_, kube::Error>(Instant::now())
    });
    // All POSTs in flight at once; each pod's start is stamped just before the batch (the
    // client sends them as fast as it can; the POST round trip is part of the figure).
    let results = futures_util::future::join_all(posts).await;
    for (name, result) in names.iter().zip(results) {
        result.with_context(|| format!("creating {name}"))?;
    }
    let mut samples = Vec::with_capacity(n);
    let mut last = first;
    for name in &names {
        let stamps = wait_stamps(watch, name).await?;
        let sample = sample(first, stamps)?;
        last = last.max(first + sample.running);
        samples.push(sample);
    }
    Ok((samples, last - first))
}

/// `--pull`: per round and node, the image removed, then a pod of it POSTed → Running.
async fn measure_pull(
    pods: &Api<Pod>,
    nodes: &[String],
    n: usize,
    pull: &PullSetup,
    watch: &mut PodWatch,
) -> Result<()> {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(n); nodes.len()];
    for round in 0..n {
        for k in 0..nodes.len() {
            let k = if round % 2 == 0 {
                k
            } else {
                nodes.len() - 1 - k
            };
            let node = &nodes[k];
            remove_image(pull, node)?;
            let name = format!("{}-pull-{round}", short(node));
            let mut spec = pod(&name, node)?;
            if let Some(c) = spec.spec.as_mut().and_then(|s| s.containers.first_mut()) {
                c.image = Some(pull.reference.clone());
                c.image_pull_policy = Some("IfNotPresent".into());
            }
            let posted = Instant::now();
            pods.create(&PostParams::default(), &spec)
                .await
                .with_context(|| format!("creating {name}"))?;
            let stamps = wait_stamps(watch, &name).await?;
            samples[k].push(sample(posted, stamps)?);
            pulled_event(pods, &name).await?;
            pods.delete(&name, &Default::default()).await?;
            eventually(&format!("{name} gone"), POD_TIMEOUT, || async {
                Ok(pods.get_opt(&name).await?.is_none().then_some(()))
            })
            .await?;
        }
    }
    println!(
        "\nImage not present: {n} pods per node, each after the image was removed from its node, \
         POST → watch event (ms), {}",
        pull.reference
    );
    report(nodes, &samples);
    println!("load average after the pull pods: {}", load_average());
    Ok(())
}

/// Waits for pod `name`'s `Pulled` event of a real pull ("Successfully pulled image …"):
/// the image was not present.
async fn pulled_event(pods: &Api<Pod>, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(pods.clone().into_client(), NAMESPACE);
    let selector = format!("involvedObject.name={name},reason=Pulled");
    eventually(
        &format!("{name}'s Pulled event"),
        Duration::from_secs(30),
        || async {
            let list = events
                .list(&kube::api::ListParams::default().fields(&selector))
                .await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.message
                        .as_deref()
                        .is_some_and(|m| m.starts_with("Successfully pulled image"))
                })
                .then_some(()))
        },
    )
    .await
}

/// Removes the `--pull` image from `node` with everything only it used, and checks it gone.
fn remove_image(pull: &PullSetup, node: &str) -> Result<()> {
    let repo = pull
        .reference
        .rsplit_once(':')
        .map_or(pull.reference.as_str(), |(r, _)| r);
    if let Some((ctr, sock, _)) = pull.peer.as_ref().filter(|(_, _, n)| n == node) {
        let ctr = |args: &[&str]| -> Result<String> {
            let out = std::process::Command::new(ctr)
                .arg("--address")
                .arg(sock)
                .args(["-n", "k8s.io"])
                .args(args)
                .output()
                .context("running ctr")?;
            ensure!(
                out.status.success(),
                "ctr {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        // Every name of the image (tag, repo digest, and the CRI's `sha256:<id>`): the
        // names whose target is the tag's manifest.
        let listed = ctr(&["images", "ls"])?;
        let rows: Vec<(&str, &str)> = listed
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?, f.nth(1)?))
            })
            .collect();
        let digests: Vec<&str> = rows
            .iter()
            .filter(|(name, _)| name.starts_with(repo))
            .map(|(_, digest)| *digest)
            .collect();
        let names: Vec<&str> = rows
            .iter()
            .filter(|(_, digest)| digests.contains(digest))
            .map(|(name, _)| *name)
            .collect();
        if !names.is_empty() {
            let mut args = vec!["images", "rm", "--sync"];
            args.extend(&names);
            ctr(&args)?;
        }
        let left = ctr(&["images", "ls", "-q"])?;
        ensure!(!left.contains(repo), "the peer still has the image: {left}");
        return Ok(());
    }
    let ironlet = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(ironlet_binary()?)
            .arg("--root-dir")
            .arg(&pull.ironlet_root)
            .args(args)
            .output()
            .context("running ironlet")?;
        ensure!(
            out.status.success(),
            "ironlet {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let listed = ironlet(&["images", "ls"])?;
    if listed.contains(repo) {
        ironlet(&["images", "rm", &pull.reference])?;
        ironlet(&["images", "prune"])?;
    }
    let left = ironlet(&["images", "ls"])?;
    ensure!(!left.contains(repo), "ironlet still has the image: {left}");
    Ok(())
}

fn sample(posted: Instant, stamps: PodStamps) -> Result<Sample> {
    let (Some(running), Some(ready)) = (stamps.running, stamps.ready) else {
        bail!("incomplete stamps");
    };
    Ok(Sample {
        running: running.saturating_duration_since(posted),
        ready: ready.saturating_duration_since(posted),
    })
}

/// Waits until the watch saw pod `name` Running and Ready.
async fn wait_stamps(watch: &mut PodWatch, name: &str) -> Result<PodStamps> {
    watch
        .wait_until(
            POD_TIMEOUT,
            name,
            |seen| {
                let stamps = seen.get(name).copied().unwrap_or_default();
                (stamps.running.is_some() && stamps.ready.is_some()).then_some(stamps)
            },
            |_| format!("pod {name} not Running and Ready within {POD_TIMEOUT:?}"),
        )
        .await
}

fn pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(sleep_pod(
        name,
        NAMESPACE,
        "api-pod-start",
        Some(node),
    ))?)
}

/// `ironlet` or `kubelet` from the node name.
fn short(node: &str) -> &str {
    node.strip_prefix("bench-").unwrap_or(node)
}

struct Figures {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

fn figures(mut values: Vec<Duration>) -> Figures {
    values.sort();
    let sum: Duration = values.iter().sum();
    Figures {
        p50: ms(percentile(&values, 50.0)),
        p90: ms(percentile(&values, 90.0)),
        p99: ms(percentile(&values, 99.0)),
        max: ms(percentile(&values, 100.0)),
        mean: ms(sum) / values.len().max(1) as f64,
    }
}

/// Prints p50/p90/p99/max/mean per node and event, then ironlet/kubelet ratios.
fn report(nodes: &[String], samples: &[Vec<Sample>]) {
    println!(
        "  {:<8} {:<8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "node", "event", "p50", "p90", "p99", "max", "mean"
    );
    let mut table = Vec::new();
    for (node, samples) in nodes.iter().zip(samples) {
        let running = figures(samples.iter().map(|s| s.running).collect());
        let ready = figures(samples.iter().map(|s| s.ready).collect());
        for (event, f) in [("Running", &running), ("Ready", &ready)] {
            println!(
                "  {:<8} {:<8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                short(node),
                event,
                f.p50,
                f.p90,
                f.p99,
                f.max,
                f.mean
            );
        }
        table.push((running, ready));
    }
    if let [(ir, ire), (kr, kre)] = table.as_slice() {
        println!(
            "  ratio ironlet/kubelet  Running: p50 {:.2}  p90 {:.2}  p99 {:.2}  |  Ready: p50 {:.2}  p99 {:.2}",
            ir.p50 / kr.p50,
            ir.p90 / kr.p90,
            ir.p99 / kr.p99,
            ire.p50 / kre.p50,
            ire.p99 / kre.p99
        );
    }
}

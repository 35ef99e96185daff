//! Container lifecycle benchmark: create + start + wait + delete of `busybox true`, with
//! ironlet's in-process runtime (zygote + libcontainer) and with `crun` and `runc` on the
//! same bundle and cgroup layout, interleaved in one run, printed as medians and ratios.
//!
//! Usage (root): `container-lifecycle [ITERATIONS]` (default 100). `BENCH_PEERS=crun,runc`
//! (the default) names the peers to run beside ironlet; `BENCH_PEERS=` runs ironlet alone,
//! for profiling. `BENCH_PHASES=1` prints ironlet's create/start/exit/delete split.
//! `BENCH_WORKDIR=DIR` moves the bundle and the state roots off their default tmpfs.
//! `BENCH_POD_MOUNTS=N` first mounts N namespace pins under the work directory, as N/3 other
//! pods would (`zygote/pod_mounts.rs`), and adds a row for ironlet with its worker detaching
//! them; the first ironlet row and the peers copy them as before. A `sleep` container runs
//! meanwhile, as the other pods' would (the zygote keeps its template namespace only while
//! it owns a process).
//!
//! crun 1.8 refuses this machine's hybrid layout because the empty cgroup2 at
//! `/sys/fs/cgroup/unified` lists controllers; so the whole benchmark runs in a private
//! mount namespace with that directory covered — the same layout for all three.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ironlet_runtime::zygote::{CreateStdio, Event, ZygoteClient};
use tokio::sync::mpsc;

use ironlet_bench::peer_bundle::{
    cgroup_parents, external, installed_peers, make_bundle, make_bundle_for, private_cgroup_layout,
    remove_new_cgroup_parents, work_dir,
};
use ironlet_bench::stats::{ms, print_p50_table};

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let iterations = ironlet_bench::count_arg("ITERATIONS", 100)?;
    // As `ironlet run` does at start (--cgroup-favor-dynmods, on by default). The switch is
    // kernel-wide, so crun and runc below run with it too.
    let dynmods =
        ironlet_cgroups::favor_dynamic_modifications().context("enabling cgroup favordynmods")?;
    println!("cgroup favordynmods: {dynmods:?}");
    private_cgroup_layout()?;
    let parents_before = cgroup_parents("ironlet-bench");
    let zygote = ironlet_runtime::zygote::spawn()?;
    let rt = ironlet_bench::runtime()?;
    let result = rt.block_on(run(zygote, iterations));
    remove_new_cgroup_parents("ironlet-bench", &parents_before);
    result
}

async fn run(zygote: ironlet_runtime::zygote::ZygoteHandle, iterations: usize) -> Result<()> {
    let work = work_dir()?;
    println!("bundle and state roots under {}", work.path().display());
    let bundle = make_bundle(work.path()).await?;
    let (tx, mut events) = mpsc::unbounded_channel();
    let client = ZygoteClient::new(zygote, tx)?;
    let hierarchy = ironlet_cgroups::Hierarchy::detect().ok();
    let state_root = work.path().join("state");
    std::fs::create_dir_all(&state_root)?;

    let other_pods = match std::env::var("BENCH_POD_MOUNTS") {
        Ok(n) => Some(OtherPodMounts::make(
            work.path(),
            n.parse().context("BENCH_POD_MOUNTS")?,
        )?),
        Err(_) => None,
    };
    const KEEPER: &str = "bench-other-pod";
    if let Some(other) = &other_pods {
        let keeper = make_bundle_for(
            work.path(),
            "bundle-keeper",
            &["sleep", "3600"],
            "/ironlet-bench/keeper",
        )
        .await?;
        client
            .create(
                KEEPER,
                keeper,
                state_root.clone(),
                CreateStdio::default(),
                Some(other.root.clone()),
            )
            .await?;
        client.start(KEEPER, state_root.clone()).await?;
    }
    let measured = measure(
        &client,
        &mut events,
        iterations,
        &bundle,
        &state_root,
        &hierarchy,
        &other_pods,
        &work,
    )
    .await;
    if other_pods.is_some() {
        client
            .kill(KEEPER, nix::sys::signal::Signal::SIGKILL as i32)
            .await?;
        loop {
            match events.recv().await.context("zygote gone")? {
                Event::Exited { id, .. } if id == KEEPER => break,
                _ => {}
            }
        }
        client.delete(KEEPER, state_root.clone(), true).await?;
    }
    measured?;
    drop(other_pods);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    client: &ZygoteClient,
    events: &mut mpsc::UnboundedReceiver<Event>,
    iterations: usize,
    bundle: &Path,
    state_root: &Path,
    hierarchy: &Option<ironlet_cgroups::Hierarchy>,
    other_pods: &Option<OtherPodMounts>,
    work: &tempfile::TempDir,
) -> Result<()> {
    let installed = installed_peers();
    let mut peers: Vec<(&str, Peer)> = vec![("ironlet (in-process)", Peer::InProcess(None))];
    if let Some(other) = &other_pods {
        peers.push((
            "ironlet, pods detached",
            Peer::InProcess(Some(other.root.clone())),
        ));
    }
    peers.extend(
        installed
            .iter()
            .map(|bin| (bin.as_str(), Peer::External(bin.as_str()))),
    );
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); peers.len()];
    // Warm-up, then interleave so drift hits every runtime alike.
    for round in 0..iterations + 3 {
        for (i, (_, bin)) in peers.iter().enumerate() {
            let id = format!("bench-{i}-{round}");
            let took = match bin {
                Peer::InProcess(pod_mounts_root) => {
                    let target = Target {
                        bundle,
                        state_root,
                        pod_mounts_root: pod_mounts_root.clone(),
                    };
                    in_process(client, events, &id, &target, hierarchy).await?
                }
                Peer::External(bin) => {
                    external(bin, &id, &work.path().join("bundle-peers"), work.path())?
                }
            };
            if round >= 3 {
                samples[i].push(took);
            }
        }
    }
    println!("container create+start+wait+delete of `busybox true`, {iterations} runs each");
    let mut rows = Vec::new();
    for ((name, _), s) in peers.iter().zip(samples.iter_mut()) {
        s.sort();
        let p50 = ms(s[s.len() / 2]);
        let p90 = ms(s[s.len() * 9 / 10]);
        let mean = s.iter().map(|d| ms(*d)).sum::<f64>() / s.len() as f64;
        rows.push((*name, [p50, p90, mean]));
    }
    print_p50_table("runtime", ["p50 ms", "p90 ms", "mean ms"], 10, &rows);
    Ok(())
}

enum Peer<'a> {
    /// The zygote; with the root whose other pods' mounts its worker detaches.
    InProcess(Option<PathBuf>),
    External(&'a str),
}

/// Where an in-process create finds its container.
struct Target<'a> {
    bundle: &'a Path,
    state_root: &'a Path,
    pod_mounts_root: Option<PathBuf>,
}

/// N pins of the bench's network namespace under `<work>/pods/<i>/ns/net`, with the work
/// directory bound onto itself as the runtime binds its root; all unmounted on drop.
struct OtherPodMounts {
    root: PathBuf,
    pins: Vec<PathBuf>,
}

impl OtherPodMounts {
    fn make(work: &Path, count: usize) -> Result<Self> {
        let root = work.canonicalize()?;
        ensure!(
            ironlet_runtime::zygote::pod_mounts::ensure_root_mount(&root)?,
            "cannot bind {} onto itself",
            root.display()
        );
        let mut made = OtherPodMounts {
            root,
            pins: Vec::with_capacity(count),
        };
        for i in 0..count {
            let pin = made.root.join(format!("pods/{i}/ns/net"));
            if let Some(dir) = pin.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&pin, "")?;
            nix::mount::mount(
                Some("/proc/self/ns/net"),
                &pin,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .with_context(|| format!("pin {}", pin.display()))?;
            made.pins.push(pin);
        }
        println!(
            "{count} other pods' pins mounted under {}",
            made.root.display()
        );
        Ok(made)
    }
}

impl Drop for OtherPodMounts {
    fn drop(&mut self) {
        for pin in &self.pins {
            let _ = nix::mount::umount2(pin, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Err(err) = ironlet_runtime::zygote::pod_mounts::release_root_mount(&self.root) {
            eprintln!("{} stays bound: {err}", self.root.display());
        }
    }
}

async fn in_process(
    client: &ZygoteClient,
    events: &mut mpsc::UnboundedReceiver<Event>,
    id: &str,
    target: &Target<'_>,
    hierarchy: &Option<ironlet_cgroups::Hierarchy>,
) -> Result<Duration> {
    let (bundle, state_root) = (target.bundle, target.state_root);
    let started = Instant::now();
    let phases = std::env::var_os("BENCH_PHASES").is_some();
    let (_pid, _start, _stdio) = client
        .create(
            id,
            bundle.to_owned(),
            state_root.to_owned(),
            CreateStdio::default(),
            target.pod_mounts_root.clone(),
        )
        .await?;
    let created = started.elapsed();
    client.start(id, state_root.to_owned()).await?;
    let begun = started.elapsed();
    loop {
        match events.recv().await.context("zygote gone")? {
            Event::Exited {
                id: done, status, ..
            } if done == id => {
                ensure!(
                    status == ironlet_runtime::zygote::WireExit::Code(0),
                    "in-process `true` exited with {status:?}"
                );
                break;
            }
            _ => {}
        }
    }
    let exited = started.elapsed();
    // As the runtime removes an exited container (see `local::cleanup`).
    if !ironlet_runtime::local::cleanup::remove_exited(
        hierarchy.as_ref(),
        Some("/ironlet-bench/c"),
        state_root,
        id,
    ) {
        client.delete(id, state_root.to_owned(), true).await?;
    }
    if phases {
        eprintln!(
            "create {:.1} start {:.1} exit {:.1} delete {:.1} ms",
            ms(created),
            ms(begun - created),
            ms(exited - begun),
            ms(started.elapsed() - exited)
        );
    }
    Ok(started.elapsed())
}

//! Container lifecycle benchmark: create + start + wait + delete of `busybox true`, with
//! ironlet's in-process runtime (zygote + libcontainer) and with `crun` and `runc` on the
//! same bundle and cgroup layout, interleaved in one run, printed as medians and ratios.
//!
//! Usage (root): `container-lifecycle [ITERATIONS]` (default 100). `BENCH_PEERS=crun,runc`
//! (the default) names the peers to run beside ironlet; `BENCH_PEERS=` runs ironlet alone,
//! for profiling. `BENCH_PHASES=1` prints ironlet's create/start/exit/delete split.
//! `BENCH_WORKDIR=DIR` moves the bundle and the state roots off their default tmpfs.
//!
//! crun 1.8 refuses this machine's hybrid layout because the empty cgroup2 at
//! `/sys/fs/cgroup/unified` lists controllers; so the whole benchmark runs in a private
//! mount namespace with that directory covered — the same layout for all three.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_runtime::image::{ImageStore, ImageStoreConfig, RootfsMode};
use ironlet_runtime::spec::{SandboxNamespaces, SpecInputs};
use ironlet_runtime::types::ContainerConfig;
use ironlet_runtime::zygote::{Event, ZygoteClient};
use ironlet_runtime::ImageService;
use tokio::sync::mpsc;

use ironlet_bench::stats::ms;

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let iterations: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("ITERATIONS must be a number")?
        .unwrap_or(100);
    // As `ironlet run` does at start (--cgroup-favor-dynmods, on by default). The switch is
    // kernel-wide, so crun and runc below run with it too.
    let dynmods =
        ironlet_cgroups::favor_dynamic_modifications().context("enabling cgroup favordynmods")?;
    println!("cgroup favordynmods: {dynmods:?}");
    private_cgroup_layout()?;
    let zygote = ironlet_runtime::zygote::spawn()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(zygote, iterations))
}

/// Private mount namespace; hide the hybrid's empty cgroup2 so crun accepts the layout.
fn private_cgroup_layout() -> Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    let unified = Path::new("/sys/fs/cgroup/unified");
    if unified.join("cgroup.controllers").exists() && Path::new("/sys/fs/cgroup/memory").exists() {
        mount(
            Some("tmpfs"),
            unified,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=4k"),
        )?;
    }
    Ok(())
}

/// Where the bundle and every runtime's state root live: a tmpfs by default, as `/run` (the
/// peers' default state roots) is on a standard host. `BENCH_WORKDIR=DIR` picks another
/// filesystem, e.g. `/tmp`. On this VM `/run` and `/tmp` are ext4 without a journal, whose
/// inode allocator skips every inode freed in the last minute or more one by one: each
/// state file a runtime creates cost 0.3–0.7 ms there, more as a session goes on.
fn work_dir() -> Result<tempfile::TempDir> {
    let base = std::env::var_os("BENCH_WORKDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"));
    tempfile::Builder::new()
        .prefix("ironlet-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("a work directory under {}", base.display()))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
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

    let mut peers: Vec<(&str, Option<&str>)> = vec![("ironlet (in-process)", None)];
    let wanted = std::env::var("BENCH_PEERS").unwrap_or_else(|_| "crun,runc".into());
    for bin in wanted.split(',').filter(|b| !b.is_empty()) {
        if Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            peers.push((bin, Some(bin)));
        } else {
            eprintln!("{bin} not installed: skipped");
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); peers.len()];
    // Warm-up, then interleave so drift hits every runtime alike.
    for round in 0..iterations + 3 {
        for (i, (_, bin)) in peers.iter().enumerate() {
            let id = format!("bench-{i}-{round}");
            let took = match bin {
                None => {
                    in_process(&client, &mut events, &id, &bundle, &state_root, &hierarchy).await?
                }
                Some(bin) => external(bin, &id, &work.path().join("bundle-peers"), work.path())?,
            };
            if round >= 3 {
                samples[i].push(took);
            }
        }
    }
    println!("container create+start+wait+delete of `busybox true`, {iterations} runs each");
    println!(
        "{:<22} {:>10} {:>10} {:>10}",
        "runtime", "p50 ms", "p90 ms", "mean ms"
    );
    let mut medians = Vec::new();
    for ((name, _), s) in peers.iter().zip(samples.iter_mut()) {
        s.sort();
        let p50 = ms(s[s.len() / 2]);
        let p90 = ms(s[s.len() * 9 / 10]);
        let mean = s.iter().map(|d| ms(*d)).sum::<f64>() / s.len() as f64;
        println!("{name:<22} {p50:>10.2} {p90:>10.2} {mean:>10.2}");
        medians.push(p50);
    }
    for ((name, _), m) in peers.iter().zip(&medians).skip(1) {
        println!("ratio ironlet/{name} (p50): {:.2}", medians[0] / m);
    }
    Ok(())
}

/// A bundle with busybox's rootfs and the spec ironlet would generate for `true`.
async fn make_bundle(dir: &Path) -> Result<PathBuf> {
    let layout = repo_root().join("images/out/busybox");
    if !layout.join("index.json").exists() {
        bail!("{} missing: run images/build first", layout.display());
    }
    let store = Arc::new(ImageStore::open_with(
        &dir.join("images"),
        ImageStoreConfig::default(),
    )?);
    let images = ironlet_runtime::image::LocalImageService::new(store.clone())
        .import(&layout)
        .await?;
    let image = images.into_iter().next().context("layout has no image")?;
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle)?;
    let prepared = store.prepare_rootfs(&image, &bundle, RootfsMode::Copy)?;
    let config = ContainerConfig {
        name: "bench".into(),
        image: "busybox".into(),
        command: vec!["true".into()],
        ..ContainerConfig::default()
    };
    let spec = ironlet_runtime::spec::build_spec(&SpecInputs {
        container: &config,
        image: &image.config,
        rootfs: &prepared.rootfs,
        hostname: "bench",
        namespaces: &SandboxNamespaces::default(),
        cgroups_path: Some("/ironlet-bench/c".into()),
        user_namespace: None,
    })?;
    // The peers get the spec as is (seccomp inside, compiled by them per container);
    // ironlet's bundle gets it the way the runtime writes it: the profile beside the
    // spec, compiled once by the zygote. Same rootfs, same cgroup path.
    let peers = dir.join("bundle-peers");
    std::fs::create_dir_all(&peers)?;
    ironlet_runtime::spec::write_bundle_config(&peers, &spec)?;
    let spec = ironlet_runtime::zygote::seccomp::precompile_profile(spec, &bundle)?;
    let spec = ironlet_runtime::zygote::cgroup_view::stage(spec, &bundle)?;
    ironlet_runtime::spec::write_bundle_config(&bundle, &spec)?;
    Ok(bundle)
}

async fn in_process(
    client: &ZygoteClient,
    events: &mut mpsc::UnboundedReceiver<Event>,
    id: &str,
    bundle: &Path,
    state_root: &Path,
    hierarchy: &Option<ironlet_cgroups::Hierarchy>,
) -> Result<Duration> {
    let started = Instant::now();
    let phases = std::env::var_os("BENCH_PHASES").is_some();
    let (_pid, _start, _out, _err) = client
        .create(id, bundle.to_owned(), state_root.to_owned())
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

fn external(bin: &str, id: &str, bundle: &Path, work: &Path) -> Result<Duration> {
    let root = work.join(format!("{bin}-root"));
    let started = Instant::now();
    let status = Command::new(bin)
        .arg("--root")
        .arg(&root)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {bin}"))?;
    let took = started.elapsed();
    ensure!(status.success(), "{bin} run failed: {status}");
    Ok(took)
}

//! One-shot container benchmark (issue 15): `ironlet ctr run --rm busybox -- true`, the
//! whole command as a user types it (process start, zygote, sandbox, rootfs, create, start,
//! exit, removal), beside `crun run` / `runc run` of a busybox bundle with the spec ironlet
//! would generate, interleaved in one run, printed as percentiles and ratios.
//!
//! Usage (root): `ctr-run [ITERATIONS]` (default 50). `IRONLET_BIN=PATH` picks the ironlet
//! binary (default: `ironlet` beside this one, i.e. the same profile); `BENCH_PEERS` and
//! `BENCH_WORKDIR` as in `container-lifecycle`. ironlet's root dir (image store, state) is
//! under the work directory, on the same file system as the peers' bundle and state.
//!
//! The peers get a prepared bundle, so they do less than `ctr run` (no image store, no
//! rootfs mount, no log file): that is the comparison the issue asks for.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use ironlet_bench::cluster::ironlet_beside_this;
use ironlet_bench::peer_bundle::{
    cgroup_parents, external, installed_peers, make_bundle, private_cgroup_layout,
    remove_new_cgroup_parents, repo_root, work_dir,
};
use ironlet_bench::stats::{ms, percentile, print_p50_table};

const WARM_UP: usize = 3;

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let iterations = ironlet_bench::count_arg("ITERATIONS", 50)?;
    let ironlet = ironlet_beside_this()?;
    let dynmods =
        ironlet_cgroups::favor_dynamic_modifications().context("enabling cgroup favordynmods")?;
    println!("cgroup favordynmods: {dynmods:?}");
    private_cgroup_layout()?;
    // `ctr run` puts containers under /ironlet (as the agent does), the peers under
    // /ironlet-bench; both parents outlive their containers and are removed at the end.
    let parents_before = [cgroup_parents("ironlet"), cgroup_parents("ironlet-bench")];
    let result = measure(&ironlet, iterations);
    remove_new_cgroup_parents("ironlet", &parents_before[0]);
    remove_new_cgroup_parents("ironlet-bench", &parents_before[1]);
    result
}

fn measure(ironlet: &Path, iterations: usize) -> Result<()> {
    let work = work_dir()?;
    println!(
        "ironlet {}; root dir, bundle and state roots under {}",
        ironlet.display(),
        work.path().display()
    );
    let root_dir = work.path().join("ironlet-root");
    import_busybox(ironlet, &root_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(make_bundle(work.path()))?;

    let mut runners: Vec<(String, Option<String>)> = vec![("ironlet ctr run --rm".into(), None)];
    for bin in installed_peers() {
        runners.push((format!("{bin} run"), Some(bin)));
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); runners.len()];
    for round in 0..iterations + WARM_UP {
        for (i, (_, peer)) in runners.iter().enumerate() {
            let took = match peer {
                None => ctr_run(ironlet, &root_dir, round)?,
                Some(bin) => external(
                    bin,
                    &format!("bench-{i}-{round}"),
                    &work.path().join("bundle-peers"),
                    work.path(),
                )?,
            };
            if round >= WARM_UP {
                samples[i].push(took);
            }
        }
    }
    println!("one-shot `busybox true`, {iterations} runs each, interleaved");
    let mut rows = Vec::new();
    for ((name, _), s) in runners.iter().zip(samples.iter_mut()) {
        s.sort();
        rows.push((
            name.as_str(),
            [50.0, 90.0, 99.0].map(|p| ms(percentile(s, p))),
        ));
    }
    print_p50_table("command", ["p50 ms", "p90 ms", "p99 ms"], 9, &rows);
    // The store holds overlay lowers and state; `ctr run --rm` removed every container.
    Command::new(ironlet)
        .arg("--root-dir")
        .arg(&root_dir)
        .args(["images", "rm", "busybox:latest"])
        .stdout(Stdio::null())
        .status()
        .context("removing the benchmark image")?;
    Ok(())
}

fn import_busybox(ironlet: &Path, root_dir: &Path) -> Result<()> {
    let layout = repo_root().join("images/out/busybox");
    let status = Command::new(ironlet)
        .arg("--root-dir")
        .arg(root_dir)
        .args(["images", "import"])
        .arg(&layout)
        .stdout(Stdio::null())
        .status()
        .context("running ironlet images import")?;
    ensure!(
        status.success(),
        "importing {} failed: {status}",
        layout.display()
    );
    Ok(())
}

fn ctr_run(ironlet: &Path, root_dir: &Path, round: usize) -> Result<Duration> {
    let started = Instant::now();
    let status = Command::new(ironlet)
        .arg("--root-dir")
        .arg(root_dir)
        .args(["ctr", "run", "--rm", "--name"])
        .arg(format!("bench-{round}"))
        .args(["busybox:latest", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .context("running ironlet ctr run")?;
    let took = started.elapsed();
    ensure!(status.success(), "ironlet ctr run failed: {status}");
    Ok(took)
}

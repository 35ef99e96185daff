//! Image pull benchmark (issue 12): a cold pull + unpack of a ~200 MB image of 9 gzip layers
//! built from the host's Debian package files (one ~100 MB layer, several small ones; see
//! `debian_image`), from a loopback registry (Debian's `docker-registry`, TLS from a test CA),
//! by ironlet (`ImageService::pull_image` into a fresh store, in this process; as configured
//! by default, with one `syncfs` after the pull, in the background, before its layers are marked
//! durable, and without it as containerd's default unpack; a `sync` after each tool's pull,
//! untimed), containerd
//! (`ctr image pull`, which unpacks through the transfer service, a fresh throw-away
//! containerd for every pull) and `skopeo copy docker://… dir:…` (download only: the network
//! floor), interleaved in one run. Then the warm `Always` pull (image present, manifest
//! unchanged) of ironlet and, for reference, of `ctr image pull`.
//!
//! Usage (root): `image-pull [COLD_ROUNDS] [WARM_PULLS]` (defaults 5 and 50). `BENCH_WORKDIR`
//! (default /tmp) holds the stores; the containerd binaries are `scripts/peer-kubelet
//! build`'s (or `CONTAINERD_BIN_DIR`).
//!
//! Times: wall time of the pull; CPU time (user + system) of whatever did the work: this
//! process's own rusage for ironlet, `ctr`'s children rusage plus the containerd daemon's
//! (its `/proc/<pid>/stat` utime, stime, cutime, cstime, so `unpigz` counts) for containerd,
//! skopeo's children rusage. The registry's CPU counts for none. All three use TLS to the same
//! registry and write under the same work directory.
//!
//! Run-queue wait: how long the threads that did the work were runnable but not running
//! (`/proc/<pid>/task/*/schedstat`, second field): this process's threads for ironlet, the
//! daemon's for containerd (`ctr` and `unpigz`, gone when read, are not counted; threads that
//! exited during the pull neither). On a shared machine it is the part of the wall time spent
//! waiting for a CPU; `nice` does not bound it across sessions when the kernel groups tasks
//! per session (`/proc/sys/kernel/sched_autogroup_enabled`), printed at start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use nix::sys::resource::{getrusage, UsageWho};

use ironlet_bench::debian_image::{build_layout, LAYERS};
use ironlet_bench::registry_hosts::write_hosts_dir;
use ironlet_bench::stats::{ms, percentile};
use ironlet_runtime::image::{ImageStore, ImageStoreConfig, LocalImageService, PullRequest};
use ironlet_runtime::testkit::registry::{RegistryOptions, TestRegistry};
use ironlet_runtime::ImageService;

const REPO_TAG: &str = "bench/debian:1";
const TOOLS: [&str; 4] = ["ironlet", "ironlet-nosync", "containerd", "skopeo"];

fn main() -> Result<()> {
    ensure!(nix::unistd::geteuid().is_root(), "the benchmark needs root");
    let mut args = std::env::args().skip(1);
    let rounds: usize = arg(args.next(), 5, "COLD_ROUNDS")?;
    let warm: usize = arg(args.next(), 50, "WARM_PULLS")?;
    let base = std::env::var_os("BENCH_WORKDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("ironlet-bench-pull-")
        .tempdir_in(&base)
        .with_context(|| format!("a work directory under {}", base.display()))?;
    let bin = containerd_bin_dir()?;
    let autogroup =
        std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").unwrap_or_default();
    println!(
        "load average {}; sched_autogroup_enabled {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
        autogroup.trim()
    );
    println!(
        "work dir {}; containerd from {}",
        work.path().display(),
        bin.display()
    );

    let started = Instant::now();
    let layout = work.path().join("layout");
    let sizes = build_layout(&layout, LAYERS, REPO_TAG)?;
    println!(
        "image: {} gzip layers, {:.1} MB unpacked, {:.1} MB compressed (largest layer {:.1} MB); built in {:.1} s",
        sizes.layers,
        mb(sizes.unpacked),
        mb(sizes.compressed),
        mb(sizes.largest_compressed),
        started.elapsed().as_secs_f64()
    );
    let registry = TestRegistry::start(RegistryOptions::default())?;
    registry.push(&layout, REPO_TAG, &[])?;
    std::fs::remove_dir_all(&layout).context("removing the layout")?;
    let reference = format!("{}/{REPO_TAG}", registry.host());
    let hosts_dir = write_hosts_dir(work.path(), &registry)?;
    println!("registry {} holds {reference}", registry.host());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ctx = Ctx {
        work: work.path().to_path_buf(),
        bin,
        hosts_dir,
        reference,
        registry,
        rt,
        layers: sizes.layers,
    };
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); TOOLS.len()];
    // One warm-up round (page cache, first connections), then `rounds` measured; the order
    // rotates so no tool always runs first or last. The stores stay until every round is
    // done: on an ext4 without a journal (this machine's root) the inode allocator skips,
    // one by one, the inodes freed in the last minute (5 with their table block dirty:
    // `recently_deleted()` in `find_inode_bit()`), so a pull right after a 10 000-file tree
    // was removed spent most of its CPU in that scan (perf: `find_get_block_common`,
    // `recently_deleted`), whichever tool it was.
    let mut used = Vec::new();
    let cold = (|| {
        for round in 0..=rounds {
            for k in 0..TOOLS.len() {
                let tool = (round + k) % TOOLS.len();
                let dir = ctx.work.join(format!("{}-{round}", TOOLS[tool]));
                used.push(dir.clone());
                let sample = match tool {
                    0 => ctx.ironlet_cold(&dir, true)?,
                    1 => ctx.ironlet_cold(&dir, false)?,
                    2 => ctx.containerd_cold(&dir)?,
                    _ => ctx.skopeo_cold(&dir)?,
                };
                // Untimed: what a tool left dirty (ironlet's background sync included) is
                // not flushed during the next tool's pull.
                nix::unistd::sync();
                if round > 0 {
                    samples[tool].push(sample);
                }
            }
        }
        anyhow::Ok(())
    })();
    for dir in &used {
        remove_tree(dir)?;
    }
    cold?;
    if rounds > 0 {
        report_cold(&mut samples, rounds);
    }
    ctx.warm(warm)?;
    Ok(())
}

struct Ctx {
    work: PathBuf,
    bin: PathBuf,
    hosts_dir: PathBuf,
    reference: String,
    registry: TestRegistry,
    rt: tokio::runtime::Runtime,
    layers: usize,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
    /// Run-queue wait (see the module doc); zero for skopeo.
    waited: Duration,
}

impl Ctx {
    /// `sync`: the store's one `syncfs` per pull before its snapshots are marked durable
    /// (the default; containerd's unpack does not sync unless `--sync-fs` /
    /// `image_pull_with_sync_fs`).
    fn ironlet_service(&self, root: &Path, sync: bool) -> Result<LocalImageService> {
        let store = Arc::new(ImageStore::open_with(
            root,
            ImageStoreConfig {
                sync_snapshots: sync,
                ..ImageStoreConfig::default()
            },
        )?);
        let config = self.registry.pull_config(&self.registry.host())?;
        Ok(LocalImageService::with_pull_config(store, config))
    }

    fn ironlet_cold(&self, root: &Path, sync: bool) -> Result<Sample> {
        let svc = self.ironlet_service(root, sync)?;
        let cpu = self_cpu();
        let waited = run_delay(std::process::id());
        let started = Instant::now();
        let report = self
            .rt
            .block_on(svc.pull_image(&self.reference, PullRequest::default()))?;
        let wall = started.elapsed();
        ensure!(
            report.layers_fetched == self.layers,
            "ironlet fetched {} layers of {}",
            report.layers_fetched,
            self.layers
        );
        Ok(Sample {
            wall,
            cpu: self_cpu().saturating_sub(cpu),
            waited: run_delay(std::process::id()).saturating_sub(waited),
        })
    }

    fn containerd_cold(&self, dir: &Path) -> Result<Sample> {
        let daemon = Containerd::start(&self.bin, dir)?;
        let result = (|| {
            let daemon_cpu = daemon.cpu()?;
            let ctr_cpu = children_cpu();
            let waited = run_delay(daemon.child.id());
            let started = Instant::now();
            daemon.ctr_pull(&self.hosts_dir, &self.reference)?;
            let wall = started.elapsed();
            let waited = run_delay(daemon.child.id()).saturating_sub(waited);
            let cpu =
                children_cpu().saturating_sub(ctr_cpu) + daemon.cpu()?.saturating_sub(daemon_cpu);
            let snapshots = daemon.snapshots()?;
            ensure!(
                snapshots == self.layers,
                "containerd has {snapshots} committed snapshots, not {}",
                self.layers
            );
            Ok(Sample { wall, cpu, waited })
        })();
        daemon.stop();
        result
    }

    fn skopeo_cold(&self, dir: &Path) -> Result<Sample> {
        let cpu = children_cpu();
        let started = Instant::now();
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy", "-q", "--src-cert-dir"])
            .arg(self.registry.ca_file().parent().unwrap_or(Path::new("/")))
            .arg(format!("docker://{}", self.reference))
            .arg(format!("dir:{}", dir.display())))?;
        Ok(Sample {
            wall: started.elapsed(),
            cpu: children_cpu().saturating_sub(cpu),
            waited: Duration::ZERO,
        })
    }

    /// The `Always` pull of an image already present: ironlet's `pull_image` and `ctr image
    /// pull` (process start included), `warm` times each, interleaved.
    fn warm(&self, warm: usize) -> Result<()> {
        let root = self.work.join("warm-ironlet");
        let dir = self.work.join("warm-containerd");
        let svc = self.ironlet_service(&root, true)?;
        self.rt
            .block_on(svc.pull_image(&self.reference, PullRequest::default()))?;
        let daemon = Containerd::start(&self.bin, &dir)?;
        let result = (|| {
            daemon.ctr_pull(&self.hosts_dir, &self.reference)?;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..warm {
                let started = Instant::now();
                let report = self
                    .rt
                    .block_on(svc.pull_image(&self.reference, PullRequest::default()))?;
                ours.push(started.elapsed());
                ensure!(report.layers_fetched == 0, "a warm pull fetched layers");
                let started = Instant::now();
                daemon.ctr_pull(&self.hosts_dir, &self.reference)?;
                theirs.push(started.elapsed());
            }
            ours.sort();
            theirs.sort();
            println!(
                "warm `Always` pull (image present, manifest unchanged), {warm} each, interleaved"
            );
            println!("{:<24} {:>9} {:>9} {:>9}", "", "p50 ms", "p90 ms", "max ms");
            for (name, s) in [("ironlet pull_image", &ours), ("ctr image pull", &theirs)] {
                let [p50, p90, max] = [50.0, 90.0, 100.0].map(|p| ms(percentile(s, p)));
                println!("{name:<24} {p50:>9.2} {p90:>9.2} {max:>9.2}");
            }
            Ok(())
        })();
        daemon.stop();
        drop(svc);
        remove_tree(&root)?;
        remove_tree(&dir)?;
        result
    }
}

fn report_cold(samples: &mut [Vec<Sample>], rounds: usize) {
    println!("cold pull + unpack ({rounds} rounds after one warm-up, interleaved); skopeo: download only");
    println!(
        "{:<14} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "", "wall p50 s", "wall min s", "wall max s", "CPU p50 s", "runq p50 s"
    );
    let mut medians = Vec::new();
    for (name, s) in TOOLS.iter().zip(samples.iter_mut()) {
        let mut walls: Vec<Duration> = s.iter().map(|x| x.wall).collect();
        let mut cpus: Vec<Duration> = s.iter().map(|x| x.cpu).collect();
        let mut waits: Vec<Duration> = s.iter().map(|x| x.waited).collect();
        walls.sort();
        cpus.sort();
        waits.sort();
        let (p50, min, max) = (
            percentile(&walls, 50.0),
            percentile(&walls, 0.0),
            percentile(&walls, 100.0),
        );
        let cpu = percentile(&cpus, 50.0);
        println!(
            "{name:<14} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>11.2}",
            p50.as_secs_f64(),
            min.as_secs_f64(),
            max.as_secs_f64(),
            cpu.as_secs_f64(),
            percentile(&waits, 50.0).as_secs_f64()
        );
        let each: Vec<String> = s
            .iter()
            .map(|x| {
                format!(
                    "{:.2}/{:.2}/{:.2}",
                    x.wall.as_secs_f64(),
                    x.cpu.as_secs_f64(),
                    x.waited.as_secs_f64()
                )
            })
            .collect();
        println!("  {name} each round, wall/CPU/runq s: {}", each.join(" "));
        medians.push((p50.as_secs_f64(), cpu.as_secs_f64()));
    }
    for (i, name) in TOOLS.iter().enumerate().skip(1) {
        println!(
            "ratio ironlet/{name}: wall {:.2}, CPU {:.2}",
            medians[0].0 / medians[i].0,
            medians[0].1 / medians[i].1
        );
    }
}

/// A throw-away containerd: root, state and sockets under its own directory, the CRI and
/// NRI plugins off; stopped (and its directory unmounted and removed by the caller) after.
struct Containerd {
    child: Child,
    ctr: PathBuf,
    socket: PathBuf,
    dir: PathBuf,
}

impl Containerd {
    fn start(bin: &Path, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let d = dir.display();
        let config = format!(
            "version = 3\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.images\", \
             \"io.containerd.cri.v1.runtime\", \"io.containerd.nri.v1.nri\"]\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n\
             [plugins]\n  [plugins.'io.containerd.internal.v1.opt']\n    path = \"{d}/opt\"\n"
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).context("writing the containerd config")?;
        let log = std::fs::File::create(dir.join("containerd.log"))?;
        let child = Command::new(bin.join("containerd"))
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting containerd")?;
        let mut daemon = Self {
            child,
            ctr: bin.join("ctr"),
            socket: dir.join("containerd.sock"),
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = daemon
                .ctr_command()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(daemon);
            }
            let exited = daemon.child.try_wait().ok().flatten().is_some();
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default();
                daemon.stop();
                bail!("containerd did not answer within 30 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ctr_command(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.arg("--address").arg(&self.socket).args(["-n", "bench"]);
        cmd
    }

    fn ctr_pull(&self, hosts_dir: &Path, reference: &str) -> Result<()> {
        run(self
            .ctr_command()
            .args(["image", "pull", "--hosts-dir"])
            .arg(hosts_dir)
            .arg(reference))
        .map(drop)
    }

    /// Committed snapshots (one per unpacked layer).
    fn snapshots(&self) -> Result<usize> {
        let out = run(self.ctr_command().args(["snapshots", "ls"]))?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| l.split_whitespace().last() == Some("Committed"))
            .count())
    }

    /// The daemon's CPU time so far, its waited-for children included.
    fn cpu(&self) -> Result<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .context("reading containerd's stat")?;
        let fields: Vec<u64> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .unwrap_or_default()
            .split_whitespace()
            .skip(11)
            .take(4)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100)
            .max(1) as u64;
        let total: u64 = fields.iter().sum();
        Ok(Duration::from_secs_f64(total as f64 / ticks as f64))
    }

    /// SIGTERM, then SIGKILL after 10 s; mounts left under its directory are detached.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        unmount_under(&self.dir);
    }
}

/// Detaches every mount under `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    under.sort_unstable_by(|a, b| b.cmp(a));
    for m in under {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn remove_tree(dir: &Path) -> Result<()> {
    unmount_under(dir);
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// `scripts/peer-kubelet build`'s bin directory (it only prints it once built), or
/// `CONTAINERD_BIN_DIR`.
fn containerd_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CONTAINERD_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/peer-kubelet");
    let out = run(Command::new(script).arg("build"))?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out).trim());
    ensure!(
        dir.join("containerd").exists() && dir.join("ctr").exists(),
        "no containerd and ctr in {}",
        dir.display()
    );
    Ok(dir)
}

fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

fn rusage_cpu(who: UsageWho) -> Duration {
    getrusage(who)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::from_secs(tv.tv_sec().max(0) as u64)
                    + Duration::from_micros(tv.tv_usec().max(0) as u64)
            };
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or_default()
}

/// Run-queue wait so far of the live threads of `pid` (see the module doc).
fn run_delay(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

fn self_cpu() -> Duration {
    rusage_cpu(UsageWho::RUSAGE_SELF)
}

fn children_cpu() -> Duration {
    rusage_cpu(UsageWho::RUSAGE_CHILDREN)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn arg(value: Option<String>, default: usize, name: &str) -> Result<usize> {
    value
        .map(|s| s.parse())
        .transpose()
        .with_context(|| format!("{name} must be a number"))
        .map(|v| v.unwrap_or(default))
}

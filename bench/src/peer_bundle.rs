//! What a run of a peer runtime needs, shared by the harnesses that compare ironlet with crun
//! and runc: the private cgroup layout crun accepts on this machine, the work directory, a
//! busybox bundle with the spec ironlet would generate, and a timed `<runtime> run`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_runtime::image::{ImageStore, ImageStoreConfig, RootfsMode};
use ironlet_runtime::spec::{SandboxNamespaces, SpecInputs};
use ironlet_runtime::types::ContainerConfig;
use ironlet_runtime::ImageService;

/// Private mount namespace; hide the hybrid's empty cgroup2 so crun accepts the layout.
pub fn private_cgroup_layout() -> Result<()> {
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
pub fn work_dir() -> Result<tempfile::TempDir> {
    let base = std::env::var_os("BENCH_WORKDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"));
    tempfile::Builder::new()
        .prefix("ironlet-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("a work directory under {}", base.display()))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A bundle with busybox's rootfs and the spec ironlet would generate for `true`.
pub async fn make_bundle(dir: &Path) -> Result<PathBuf> {
    make_bundle_for(dir, "bundle", &["true"], "/ironlet-bench/c").await
}

/// A bundle `<dir>/<name>` running `command` in cgroup `cgroups_path`; the peers' copy of
/// the spec goes to `<dir>/<name>-peers`.
pub async fn make_bundle_for(
    dir: &Path,
    name: &str,
    command: &[&str],
    cgroups_path: &str,
) -> Result<PathBuf> {
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
    let bundle = dir.join(name);
    std::fs::create_dir_all(&bundle)?;
    let prepared = store.prepare_rootfs(&image, &bundle, RootfsMode::Copy)?;
    let config = ContainerConfig {
        name: "bench".into(),
        image: "busybox".into(),
        command: command.iter().map(|c| (*c).to_owned()).collect(),
        ..ContainerConfig::default()
    };
    let spec = ironlet_runtime::spec::build_spec(&SpecInputs {
        container: &config,
        image: &image.config,
        rootfs: &prepared.rootfs,
        rootfs_layers: &[],
        hostname: "bench",
        namespaces: &SandboxNamespaces::default(),
        cgroups_path: Some(cgroups_path.into()),
        user_namespace: None,
    })?;
    // The peers get the spec as is (seccomp inside, compiled by them per container);
    // ironlet's bundle gets it the way the runtime writes it: the profile beside the
    // spec, compiled once by the zygote. Same rootfs, same cgroup path.
    let peers = dir.join(format!("{name}-peers"));
    std::fs::create_dir_all(&peers)?;
    ironlet_runtime::spec::write_bundle_config(&peers, &spec)?;
    let spec = ironlet_runtime::zygote::seccomp::precompile_profile(spec, &bundle)?;
    let spec = ironlet_runtime::zygote::cgroup_view::stage(spec, &bundle)?;
    ironlet_runtime::spec::write_bundle_config(&bundle, &spec)?;
    Ok(bundle)
}

/// The peer runtimes `BENCH_PEERS` names (default `crun,runc`; empty: none) that are
/// installed; the missing ones are reported and skipped.
pub fn installed_peers() -> Vec<String> {
    let wanted = std::env::var("BENCH_PEERS").unwrap_or_else(|_| "crun,runc".into());
    wanted
        .split(',')
        .filter(|b| !b.is_empty())
        .filter(|bin| {
            let found = Command::new(bin)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                eprintln!("{bin} not installed: skipped");
            }
            found
        })
        .map(str::to_owned)
        .collect()
}

/// `<bin> --root <work>/<bin>-root run --bundle <bundle> <id>`, timed; fails unless it exits 0.
pub fn external(bin: &str, id: &str, bundle: &Path, work: &Path) -> Result<Duration> {
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

/// Cgroup directories named `name` directly under each mounted hierarchy (every v1
/// controller, or the v2 root): what a benchmark's runtimes create as the parent of their
/// containers' cgroups. Directories on other file systems (the tmpfs that
/// [`private_cgroup_layout`] puts over the hybrid's cgroup2) are not cgroups and are skipped.
pub fn cgroup_parents(name: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![base.to_owned()];
    if let Ok(entries) = std::fs::read_dir(base) {
        hierarchies.extend(entries.flatten().map(|e| e.path()));
    }
    hierarchies
        .into_iter()
        .filter(|h| is_cgroup_fs(h))
        .map(|h| h.join(name))
        .filter(|dir| dir.is_dir())
        .collect()
}

fn is_cgroup_fs(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
    statfs(dir).is_ok_and(|fs| {
        fs.filesystem_type() == CGROUP_SUPER_MAGIC || fs.filesystem_type() == CGROUP2_SUPER_MAGIC
    })
}

/// Removes the (empty) cgroup parents named `name` that did not exist in `before`, so that a
/// benchmark leaves the hierarchy as it found it.
pub fn remove_new_cgroup_parents(name: &str, before: &[PathBuf]) {
    for dir in cgroup_parents(name) {
        if !before.contains(&dir) {
            if let Err(e) = std::fs::remove_dir(&dir) {
                eprintln!("cannot remove {}: {e}", dir.display());
            }
        }
    }
}

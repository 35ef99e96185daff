//! Shared by the real-container tests and the benchmarks of every crate: where the
//! repository's test images are, built on first use by `images/build` (deterministic, from
//! Debian's `busybox-static`, no network), a store holding busybox, a busybox `sh -c`
//! container, and the clean-up of a test's cgroup parent. Not part of the runtime proper.

use std::path::{Path, PathBuf};

pub mod proxy;
pub mod pty;
pub mod registry;
pub mod smallfs;

/// `images/build` could not produce the test images.
#[derive(Debug, thiserror::Error)]
pub enum TestImagesError {
    #[error("running {script}")]
    Spawn {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{script} failed with {status}")]
    Failed {
        script: PathBuf,
        status: std::process::ExitStatus,
    },
}

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `images/out`, with every test image built.
pub fn test_images() -> Result<PathBuf, TestImagesError> {
    let out = repo_root().join("images/out");
    let missing = ["busybox", "layered", "nonroot"]
        .iter()
        .any(|name| !out.join(name).join("index.json").exists());
    if missing {
        let script = repo_root().join("images/build");
        let status = std::process::Command::new(&script)
            .arg(&out)
            .status()
            .map_err(|source| TestImagesError::Spawn {
                script: script.clone(),
                source,
            })?;
        if !status.success() {
            return Err(TestImagesError::Failed { script, status });
        }
    }
    Ok(out)
}

/// The busybox OCI layout.
pub fn busybox_layout() -> Result<PathBuf, TestImagesError> {
    Ok(test_images()?.join("busybox"))
}

/// A test image store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TestStoreError {
    #[error(transparent)]
    Images(#[from] TestImagesError),
    #[error(transparent)]
    Store(#[from] crate::image::ImageError),
}

/// An image store under `<root>/images` holding the `busybox` test image, as the
/// real-container tests start from.
pub async fn busybox_store(
    root: &Path,
) -> Result<std::sync::Arc<crate::image::ImageStore>, TestStoreError> {
    use crate::ImageService;
    let store = std::sync::Arc::new(crate::image::ImageStore::open_with(
        &root.join("images"),
        crate::image::ImageStoreConfig::default(),
    )?);
    crate::image::LocalImageService::new(store.clone())
        .import(&busybox_layout()?)
        .await?;
    Ok(store)
}

/// Removes a test runtime's cgroup parent `name` from the cgroup2 root and from every v1
/// hierarchy, with any empty cgroups left below it: the runtime removes its containers'
/// cgroups, but a test whose client went away on purpose leaves them, as it would to the
/// next client. Failures are reported, not fatal.
pub fn remove_cgroup_parent(name: &str) {
    let base = Path::new("/sys/fs/cgroup");
    let hierarchies = std::fs::read_dir(base).into_iter().flatten().flatten();
    for dir in std::iter::once(base.join(name)).chain(hierarchies.map(|h| h.path().join(name))) {
        remove_cgroup_tree(&dir);
    }
}

/// Removes an empty cgroup and the empty cgroups below it, deepest first (a cgroup
/// directory holds only control files, which `rmdir` takes along).
fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&child.path());
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        eprintln!("cannot remove {}: {e}", dir.display());
    }
}

/// A container of the `busybox` test image running `sh -c SCRIPT`, logging to
/// `NAME/0.log` under its sandbox's log directory.
pub fn busybox_sh(name: &str, script: &str) -> crate::types::ContainerConfig {
    crate::types::ContainerConfig {
        name: name.to_owned(),
        image: "busybox".into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: PathBuf::from(format!("{name}/0.log")),
        ..crate::types::ContainerConfig::default()
    }
}

/// Host processes whose command line is exactly `args` (`/proc/<pid>/cmdline`): how a
/// test sees that an exec'd process runs, or is gone.
pub fn processes_with_cmdline(args: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
            (cmdline == want).then_some(pid)
        })
        .collect()
}

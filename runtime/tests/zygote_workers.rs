//! The zygote answers a call as soon as its worker's result is whole, not when the worker
//! has finished exiting, and still reaps what the worker created: a container init or exec
//! process stays the worker's child until the worker is gone, so the zygote must not try to
//! reap it before. Workers are made to linger after their result (a test hook in
//! `zygote::worker`), which turns that window from microseconds into seconds.
//!
//! Its own binary: the hook is an environment variable the zygote inherits, set before the
//! zygote is forked, and it must not slow down the other container tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ironlet_runtime::image::{ImageStore, ImageStoreConfig, LocalImageService};
use ironlet_runtime::testkit::busybox_sh;
use ironlet_runtime::types::{ContainerState, ExitReason, PodSandboxConfig};
use ironlet_runtime::{ImageService, LocalRuntime, LocalRuntimeConfig, Runtime};

/// How long each worker stays alive after writing its result.
const LINGER: Duration = Duration::from_secs(3);

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("zygote_workers: skipped, needs root");
        return;
    }
    // Still single-threaded: setting the environment is sound, and the zygote inherits it.
    std::env::set_var(
        "IRONLET_TEST_WORKER_LINGER_MS",
        LINGER.as_millis().to_string(),
    );
    let zygote = match ironlet_runtime::zygote::spawn() {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn the zygote: {e}");
            std::process::exit(1);
        }
    };
    let root = std::env::temp_dir().join(format!("ironlet-zw-test-{}", std::process::id()));
    let name = "a_reply_does_not_wait_for_the_worker_to_exit_and_exits_are_still_reaped";
    let outcome = run(zygote, &root);
    let _ = std::fs::remove_dir_all(&root);
    ironlet_runtime::testkit::remove_cgroup_parent(&format!("ironlet-zw-{}", std::process::id()));
    match outcome {
        Ok(()) => println!("test {name} ... ok\n\ntest result: ok. 1 passed; 0 failed"),
        Err(e) => {
            println!("test {name} ... FAILED\n\n{e:#}\n\ntest result: FAILED. 0 passed; 1 failed");
            std::process::exit(101);
        }
    }
}

fn run(zygote: ironlet_runtime::zygote::ZygoteHandle, root: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = Arc::new(ImageStore::open_with(
            &root.join("images"),
            ImageStoreConfig::default(),
        )?);
        LocalImageService::new(store.clone())
            .import(&ironlet_runtime::testkit::busybox_layout()?)
            .await?;
        let config = LocalRuntimeConfig {
            root_dir: root.to_owned(),
            rootless: false,
            default_cgroup_parent: Some(format!("/ironlet-zw-{}", std::process::id())),
            cni: None,
        };
        let runtime = LocalRuntime::new(config, zygote, store).await?;
        exercise(&runtime, root).await
    })
}

async fn exercise(runtime: &LocalRuntime, root: &std::path::Path) -> Result<()> {
    let uid = ironlet_runtime::types::ContainerId::random().to_string();
    let sandbox = runtime
        .run_pod_sandbox(&PodSandboxConfig {
            pod_uid: uid.clone(),
            name: "linger".into(),
            namespace: "test".into(),
            hostname: "linger".into(),
            log_directory: root.join("logs").join(format!("test_linger_{uid}")),
            ..PodSandboxConfig::default()
        })
        .await?;
    let checked = check(runtime, &sandbox).await;
    // Always: a container left created but never started would keep the zygote alive.
    let stopped = runtime.stop_pod_sandbox(&sandbox).await;
    let removed = runtime.remove_pod_sandbox(&sandbox).await;
    checked?;
    stopped?;
    removed?;
    Ok(())
}

async fn check(runtime: &LocalRuntime, sandbox: &ironlet_runtime::types::SandboxId) -> Result<()> {
    // A container that exits at once: its init ends while its worker still lingers.
    let quick = busybox_sh("quick", "exit 7");
    let asked = Instant::now();
    let id = runtime.create_container(sandbox, &quick).await?;
    let took = asked.elapsed();
    ensure!(
        took < LINGER,
        "create took {took:?}: the reply waited for the worker ({LINGER:?}) to exit"
    );
    runtime.start_container(&id).await?;
    let status = tokio::time::timeout(LINGER * 4, runtime.wait(&id))
        .await
        .context("the exit of a container whose worker lingered was never reported")??;
    ensure!(
        status.exit_code == Some(7) && status.reason == Some(ExitReason::Error),
        "a container exiting 7 while its worker lingered got {status:?}"
    );

    // The same for an exec'd process, whose parent is its (lingering) exec worker.
    let long = busybox_sh("long", "sleep 60");
    let id = runtime.create_container(sandbox, &long).await?;
    runtime.start_container(&id).await?;
    let cmd: Vec<String> = ["sh", "-c", "echo out; exit 3"].map(String::from).to_vec();
    let out = runtime
        .exec_sync(&id, &cmd, Some(LINGER * 4))
        .await
        .context("exec whose worker lingered")?;
    ensure!(
        out.exit_code == 3 && out.stdout == b"out\n",
        "exec while its worker lingered: code {}, stdout {:?}",
        out.exit_code,
        String::from_utf8_lossy(&out.stdout)
    );
    let st = runtime.container_status(&id).await?;
    ensure!(st.state == ContainerState::Running, "{st:?}");
    Ok(())
}

//! The zygote's handling of its workers and of a client that goes away.
//!
//! - It answers a call as soon as its worker's result is whole, not when the worker has
//!   finished exiting, and still reaps what the worker created: a container init or exec
//!   process stays the worker's child until the worker is gone, so the zygote must not try
//!   to reap it before. Workers are made to linger after their result (a test hook in
//!   `zygote::worker`), which turns that window from microseconds into seconds.
//! - A private zygote whose client hung up kills the containers that client created but
//!   never started, then exits.
//!
//! Its own binary: the hook is an environment variable the zygote inherits, set before the
//! first zygote is forked (and removed before the second), and it must not slow down the
//! other container tests.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ironlet_runtime::testkit::busybox_sh;
use ironlet_runtime::types::{ContainerState, ExitReason, PodSandboxConfig};
use ironlet_runtime::zygote::ZygoteHandle;
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};

/// How long each worker stays alive after writing its result.
const LINGER: Duration = Duration::from_secs(3);

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("zygote_workers: skipped, needs root");
        return;
    }
    // Still single-threaded: setting the environment is sound; the first zygote inherits
    // the hook, the second does not.
    std::env::set_var(
        "IRONLET_TEST_WORKER_LINGER_MS",
        LINGER.as_millis().to_string(),
    );
    let lingering = spawn_zygote();
    std::env::remove_var("IRONLET_TEST_WORKER_LINGER_MS");
    let plain = spawn_zygote();

    let mut failed = 0;
    let tests: [(&str, Scenario, ZygoteHandle); 2] = [
        (
            "a_reply_does_not_wait_for_the_worker_to_exit_and_exits_are_still_reaped",
            Scenario::LingeringWorkers,
            lingering,
        ),
        (
            "a_private_zygote_kills_what_its_gone_client_created_but_never_started",
            Scenario::UnstartedAfterHangup,
            plain,
        ),
    ];
    for (i, (name, scenario, zygote)) in tests.into_iter().enumerate() {
        let root = std::env::temp_dir().join(format!("ironlet-zw-test-{}-{i}", std::process::id()));
        let parent = format!("ironlet-zw-{}-{i}", std::process::id());
        let outcome = run(zygote, &root, &parent, scenario);
        unmount_below(&root);
        let _ = std::fs::remove_dir_all(&root);
        ironlet_runtime::testkit::remove_cgroup_parent(&parent);
        match outcome {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED\n\n{e:#}\n");
            }
        }
    }
    if failed == 0 {
        println!("\ntest result: ok. 2 passed; 0 failed");
    } else {
        println!(
            "\ntest result: FAILED. {} passed; {failed} failed",
            2 - failed
        );
        std::process::exit(101);
    }
}

#[derive(Clone, Copy)]
enum Scenario {
    LingeringWorkers,
    UnstartedAfterHangup,
}

fn spawn_zygote() -> ZygoteHandle {
    match ironlet_runtime::zygote::spawn() {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn the zygote: {e}");
            std::process::exit(1);
        }
    }
}

fn run(zygote: ZygoteHandle, root: &Path, cgroup_parent: &str, scenario: Scenario) -> Result<()> {
    std::fs::create_dir_all(root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let zygote_pid = zygote.pid;
    let unstarted = rt.block_on(async {
        let store = ironlet_runtime::testkit::busybox_store(root).await?;
        let config = LocalRuntimeConfig {
            root_dir: root.to_owned(),
            rootless: false,
            default_cgroup_parent: Some(format!("/{cgroup_parent}")),
            cni: None,
            log_rotation: Default::default(),
        };
        let runtime = LocalRuntime::new(config, zygote, store).await?;
        match scenario {
            Scenario::LingeringWorkers => exercise(&runtime, root).await.map(|()| None),
            Scenario::UnstartedAfterHangup => create_unstarted(&runtime, root).await.map(Some),
        }
    })?;
    // Only the runtime's end closes the connection: its tasks hold the client.
    rt.shutdown_timeout(Duration::from_secs(5));
    match unstarted {
        Some(init) => check_hangup_cleanup(init, zygote_pid),
        None => Ok(()),
    }
}

/// What a scenario leaves mounted under its root when it could not clean up through the
/// runtime (its zygote is gone): sandbox namespace pins, container root filesystems.
fn unmount_below(root: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A client creates a container and goes away before starting it: the init waits on its
/// notify socket, and nobody can ever start it. The private zygote must kill it, reap it and
/// exit, instead of keeping both forever.
async fn create_unstarted(runtime: &LocalRuntime, root: &Path) -> Result<i32> {
    let sandbox = runtime
        .run_pod_sandbox(&sandbox_config(root, "hangup"))
        .await?;
    let never = busybox_sh("never", "sleep 600");
    let id = runtime.create_container(&sandbox, &never).await?;
    let init = runtime
        .container_status(&id)
        .await?
        .pid
        .context("a created container has no init pid")?;
    ensure!(
        running(init),
        "the created container's init {init} is not there"
    );
    Ok(init)
}

fn check_hangup_cleanup(init: i32, zygote: i32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while (running(init) || running(zygote)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let outcome = if running(init) {
        Err(anyhow::anyhow!(
            "the never-started container's init {init} outlived its client by 15 s"
        ))
    } else if running(zygote) {
        Err(anyhow::anyhow!(
            "the private zygote {zygote} still runs 15 s after its client left"
        ))
    } else {
        Ok(())
    };
    if outcome.is_err() {
        // Leave nothing behind: a live zygote would hold this binary's output open.
        for pid in [init, zygote] {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    outcome
}

/// The process exists and has not exited (a zombie waiting for its parent has).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s != "Z"))
        })
        .unwrap_or(false)
}

fn sandbox_config(root: &Path, name: &str) -> PodSandboxConfig {
    let uid = ironlet_runtime::types::ContainerId::random().to_string();
    PodSandboxConfig {
        pod_uid: uid.clone(),
        name: name.into(),
        namespace: "test".into(),
        hostname: name.into(),
        log_directory: root.join("logs").join(format!("test_{name}_{uid}")),
        ..PodSandboxConfig::default()
    }
}

async fn exercise(runtime: &LocalRuntime, root: &Path) -> Result<()> {
    let sandbox = runtime
        .run_pod_sandbox(&sandbox_config(root, "linger"))
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

//! Real containers on this machine, as root: output and exit codes, limits, seccomp, exec,
//! concurrency, stop timing and clean-up. A custom harness (`harness = false`) forks the
//! zygote before the test threads exist, exactly as the binary does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ironlet_runtime::types::{
    ContainerConfig, ContainerState, ExecRequest, ExitReason, LinuxResources, PodSandboxConfig,
    SandboxId, SeccompProfile,
};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};
use libtest_mimic::{Arguments, Failed, Trial};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type TestFn = fn(&Env) -> Result<()>;

struct Env {
    rt: tokio::runtime::Runtime,
    runtime: LocalRuntime,
    root: PathBuf,
}

use ironlet_runtime::testkit::{busybox_sh, busybox_store, processes_with_cmdline};

fn main() {
    let args = Arguments::from_args();
    if !nix::unistd::geteuid().is_root() {
        println!("containers: skipped, needs root");
        return;
    }
    // Before any thread: the zygote forks from a single-threaded process.
    let zygote = match ironlet_runtime::zygote::spawn() {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn the zygote: {e}");
            std::process::exit(1);
        }
    };
    let env = match setup(zygote) {
        Ok(env) => Arc::new(env),
        Err(e) => {
            eprintln!("test setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    let tests: Vec<(&str, TestFn)> = vec![
        (
            "output_lands_in_the_cri_log_and_the_exit_code_is_right",
            output_and_exit_code,
        ),
        (
            "a_memory_limit_kills_a_memory_hog_and_the_status_says_oomkilled",
            memory_limit_oom,
        ),
        ("a_pids_limit_stops_a_fork_bomb", pids_limit),
        (
            "a_container_sees_its_own_cgroup_read_only_and_cannot_lift_its_limits",
            cgroup_view_read_only,
        ),
        ("a_seccomp_blocked_syscall_fails_with_eperm", seccomp_eperm),
        (
            "a_container_allowed_to_escalate_runs_confined_without_no_new_privs",
            seccomp_without_no_new_privs,
        ),
        (
            "a_container_cannot_open_a_host_device_through_a_node_it_makes",
            host_device_unopenable,
        ),
        ("exec_returns_output_and_exit_code", exec_output),
        (
            "an_exec_runs_as_the_containers_user_with_its_no_new_privs_either_way",
            exec_follows_the_container,
        ),
        (
            "an_exec_is_in_the_containers_cgroups_and_namespaces",
            exec_joins_the_container,
        ),
        (
            "a_streaming_exec_takes_stdin_to_eof_and_dropping_it_kills_the_process_tree",
            exec_streaming,
        ),
        (
            "a_tty_container_is_attached_resized_and_logged_and_a_tty_exec_exits_with_its_code",
            tty_attach_and_exec,
        ),
        (
            "a_stdin_once_container_reads_what_attach_wrote_then_end_of_file",
            stdin_once_attach,
        ),
        (
            "a_privileged_container_may_add_a_link_to_its_network_namespace_an_unprivileged_one_not",
            privileged_commands,
        ),
        (
            "the_status_after_an_exit_comes_with_the_whole_log_written",
            status_after_exit_has_whole_log,
        ),
        (
            "fifty_containers_started_concurrently_all_finish",
            fifty_concurrent,
        ),
        (
            "stop_sends_sigterm_then_sigkill_after_the_grace_period",
            stop_grace,
        ),
        (
            "containers_of_a_sandbox_share_network_and_uts_namespaces",
            sandbox_sharing,
        ),
        (
            "removal_leaves_no_directory_mount_or_cgroup_behind",
            removal_cleans_up,
        ),
        (
            "the_container_oom_score_adj_does_not_touch_the_caller",
            oom_score_adj_isolated,
        ),
        (
            "a_missing_image_fails_create_and_leaves_nothing",
            missing_image,
        ),
        (
            "a_container_whose_sandbox_is_removed_during_its_create_is_refused_and_leaves_nothing",
            create_racing_sandbox_removal,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let env = env.clone();
            Trial::test(name, move || {
                f(&env).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let root = env.root.clone();
    drop(env);
    // Every test removed its pods, so the runtime removed its root's bind
    // (`zygote/pod_mounts.rs`): nothing under the root stays mounted.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(root.to_string_lossy().as_ref()))
        .collect();
    let _ = std::fs::remove_dir_all(&root);
    if !left.is_empty() {
        eprintln!("mounts left under {}: {left:#?}", root.display());
        std::process::exit(1);
    }
    ironlet_runtime::testkit::remove_cgroup_parent(&format!("ironlet-test-{}", std::process::id()));
    conclusion.exit();
}

fn setup(zygote: ironlet_runtime::zygote::ZygoteHandle) -> Result<Env> {
    let root = std::env::temp_dir().join(format!("ironlet-rt-test-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let runtime = rt.block_on(async {
        let store = busybox_store(&root).await?;
        let config = LocalRuntimeConfig {
            root_dir: root.clone(),
            rootless: false,
            default_cgroup_parent: Some(format!("/ironlet-test-{}", std::process::id())),
            cni: None,
            log_rotation: Default::default(),
        };
        anyhow::Ok(LocalRuntime::new(config, zygote, store).await?)
    })?;
    Ok(Env { rt, runtime, root })
}

fn sandbox_config(env: &Env, name: &str) -> PodSandboxConfig {
    let uid = ironlet_runtime::types::ContainerId::random().to_string();
    PodSandboxConfig {
        pod_uid: uid.clone(),
        name: name.to_owned(),
        namespace: "test".into(),
        hostname: name.to_owned(),
        log_directory: env.root.join("logs").join(format!("test_{name}_{uid}")),
        ..PodSandboxConfig::default()
    }
}

/// Creates a sandbox with one container, starts it and returns both ids.
async fn start_one(
    env: &Env,
    config: &ContainerConfig,
) -> Result<(SandboxId, ironlet_runtime::types::ContainerId)> {
    let sandbox = env
        .runtime
        .run_pod_sandbox(&sandbox_config(env, &config.name))
        .await?;
    let id = env.runtime.create_container(&sandbox, config).await?;
    env.runtime.start_container(&id).await?;
    Ok((sandbox, id))
}

async fn wait_exit(
    env: &Env,
    id: &ironlet_runtime::types::ContainerId,
    secs: u64,
) -> Result<ironlet_runtime::types::ContainerStatus> {
    tokio::time::timeout(Duration::from_secs(secs), env.runtime.wait(id))
        .await
        .with_context(|| format!("container did not exit within {secs}s: is the exit event lost?"))?
        .map_err(Into::into)
}

/// Reads a CRI log as (stream, content) pairs, after the pump has caught up.
async fn log_lines(path: &Path, want_at_least: usize) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<_> = text
            .lines()
            .filter_map(ironlet_runtime::local::logs::parse_record)
            .map(|(s, _, c)| (s.to_owned(), c.to_owned()))
            .collect();
        if lines.len() >= want_at_least || Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `exec_sync` of `args` with a 10 s timeout.
async fn exec_10s(
    env: &Env,
    id: &ironlet_runtime::types::ContainerId,
    args: &[&str],
) -> Result<ironlet_runtime::types::ExecOutput> {
    let cmd: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Ok(env
        .runtime
        .exec_sync(id, &cmd, Some(Duration::from_secs(10)))
        .await?)
}

async fn cleanup(env: &Env, sandbox: &SandboxId) -> Result<()> {
    env.runtime.stop_pod_sandbox(sandbox).await?;
    env.runtime.remove_pod_sandbox(sandbox).await?;
    Ok(())
}

/// Device rules: a container's root may hold `CAP_MKNOD` (containerd's default set, on
/// cgroup v1), yet a node it makes for a host device outside the default list (here
/// `/dev/kmsg`, char 1:11, which root on the host can open) must not open: the device
/// cgroup allows only the default devices. (On cgroup v2, where this build has no device
/// rules, `CAP_MKNOD` is not in the default set and the `mknod` itself fails.)
fn host_device_unopenable(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let script = "mknod /dev/hostkmsg c 1 11 && echo made; \
                      (exec 3</dev/hostkmsg) && echo OPENED";
        let (sandbox, id) = start_one(env, &busybox_sh("kmsg", script)).await?;
        let status = wait_exit(env, &id, 20).await?;
        let lines = log_lines(&status.log_path, 2).await;
        ensure!(
            !lines.iter().any(|(_, l)| l == "OPENED"),
            "the container opened the host's /dev/kmsg: {lines:?}"
        );
        ensure!(
            lines
                .iter()
                .any(|(_, l)| l.contains("Operation not permitted")),
            "neither mknod nor open was refused: {lines:?}"
        );
        // The same script, privileged: every device is allowed, so the open works (this
        // proves that the refusal above comes from the device rules, not the host).
        let mut privileged = busybox_sh("kmsg-privileged", script);
        privileged.security.privileged = true;
        let (sandbox2, id2) = start_one(env, &privileged).await?;
        let status = wait_exit(env, &id2, 20).await?;
        let lines = log_lines(&status.log_path, 2).await;
        ensure!(
            lines.iter().any(|(_, l)| l == "OPENED"),
            "a privileged container could not open /dev/kmsg either: {lines:?}"
        );
        cleanup(env, &sandbox2).await?;
        cleanup(env, &sandbox).await
    })
}

/// The upstream `PrivilegedPod should enable privileged commands` spec: `ip link add` in the
/// pod's network namespace works for a privileged container (CAP_NET_ADMIN) and is refused
/// for a regular one. The spec adds a `dummy` link; a `bridge` is used here because this
/// machine's kernel has no `dummy` driver. Both links go with the sandbox's namespace.
fn privileged_commands(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let script = "ip link add irltest0 type bridge && echo ADDED; ip link show irltest0";
        let (sandbox, id) = start_one(env, &busybox_sh("net-admin", script)).await?;
        let status = wait_exit(env, &id, 20).await?;
        let lines = log_lines(&status.log_path, 1).await;
        ensure!(
            !lines.iter().any(|(_, l)| l == "ADDED"),
            "an unprivileged container added a link: {lines:?}"
        );
        ensure!(
            lines
                .iter()
                .any(|(_, l)| l.contains("Operation not permitted")),
            "the link was not refused for want of privilege: {lines:?}"
        );
        let mut privileged = busybox_sh("net-admin-privileged", script);
        privileged.security.privileged = true;
        let (sandbox2, id2) = start_one(env, &privileged).await?;
        let status = wait_exit(env, &id2, 20).await?;
        let lines = log_lines(&status.log_path, 2).await;
        ensure!(
            lines.iter().any(|(_, l)| l == "ADDED")
                && lines.iter().any(|(_, l)| l.contains("irltest0")),
            "a privileged container could not add a link: {lines:?}"
        );
        cleanup(env, &sandbox2).await?;
        cleanup(env, &sandbox).await?;
        // In the sandboxes' namespaces, never the host's.
        ensure!(
            !std::path::Path::new("/sys/class/net/irltest0").exists(),
            "the link was made on the host"
        );
        Ok(())
    })
}

fn output_and_exit_code(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let (sandbox, id) = start_one(
            env,
            &busybox_sh("out", "echo to-stdout; echo to-stderr >&2; exit 3"),
        )
        .await?;
        let status = wait_exit(env, &id, 20).await?;
        ensure!(
            status.exit_code == Some(3),
            "exit code {:?}",
            status.exit_code
        );
        ensure!(
            status.reason == Some(ExitReason::Error),
            "reason {:?}",
            status.reason
        );
        ensure!(status.started_at.is_some() && status.finished_at.is_some());
        let lines = log_lines(&status.log_path, 2).await;
        ensure!(
            lines.contains(&("stdout".into(), "to-stdout".into())),
            "log: {lines:?}"
        );
        ensure!(
            lines.contains(&("stderr".into(), "to-stderr".into())),
            "log: {lines:?}"
        );
        ensure!(
            status.log_path.ends_with("out/0.log"),
            "log path {:?}",
            status.log_path
        );
        let (sandbox2, id2) = start_one(env, &busybox_sh("ok", "true")).await?;
        let ok = wait_exit(env, &id2, 20).await?;
        ensure!(
            ok.exit_code == Some(0) && ok.reason == Some(ExitReason::Completed),
            "{ok:?}"
        );
        cleanup(env, &sandbox).await?;
        cleanup(env, &sandbox2).await
    })
}

fn memory_limit_oom(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut config = busybox_sh("hog", "tail /dev/zero");
        config.resources = LinuxResources {
            memory_limit_bytes: Some(16 << 20),
            ..LinuxResources::default()
        };
        let (sandbox, id) = start_one(env, &config).await?;
        let status = wait_exit(env, &id, 30).await?;
        ensure!(
            status.reason == Some(ExitReason::OOMKilled),
            "status {status:?}"
        );
        ensure!(
            status.exit_code == Some(137),
            "exit code {:?}",
            status.exit_code
        );
        cleanup(env, &sandbox).await
    })
}

fn pids_limit(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        // busybox sh gives up the script at the first failed fork.
        let bomb = "i=0; while [ $i -lt 40 ]; do sleep 5 & i=$((i+1)); done; echo all-forked; wait";
        let mut limited = busybox_sh("forkbomb", bomb);
        limited.resources.pids_limit = Some(10);
        let mut roomy = busybox_sh("forkroom", bomb);
        roomy.resources.pids_limit = Some(100);
        let (s1, id1) = start_one(env, &limited).await?;
        let (s2, id2) = start_one(env, &roomy).await?;
        let a = wait_exit(env, &id1, 30).await?;
        let la = log_lines(&a.log_path, 1).await;
        ensure!(
            la.iter()
                .any(|(s, l)| s == "stderr" && l.contains("can't fork")),
            "no fork failure: {la:?}"
        );
        ensure!(
            !la.iter().any(|(_, l)| l == "all-forked"),
            "40 forks succeeded under a limit of 10"
        );
        ensure!(a.exit_code != Some(0), "exit {:?}", a.exit_code);
        // The same script with room to spare forks all 40: the limit made the difference.
        let b = wait_exit(env, &id2, 30).await?;
        let lb = log_lines(&b.log_path, 1).await;
        ensure!(
            lb.iter().any(|(_, l)| l == "all-forked"),
            "control run: {lb:?}"
        );
        ensure!(b.exit_code == Some(0), "control exit {:?}", b.exit_code);
        cleanup(env, &s1).await?;
        cleanup(env, &s2).await
    })
}

fn cgroup_view_read_only(env: &Env) -> Result<()> {
    // cgroup v1's per-hierarchy view; on v2 the namespaced cgroup2 mount is libcontainer's.
    if !Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        println!("not a cgroup v1 host: skipped");
        return Ok(());
    }
    let script = "cd /sys/fs/cgroup; \
        echo limit=$(cat memory/memory.limit_in_bytes) pids=$(cat pids/pids.max); \
        echo max > pids/pids.max; echo pids-write=$?; \
        echo -1 > memory/memory.limit_in_bytes; echo memory-write=$?; \
        echo after=$(cat pids/pids.max) $(cat memory/memory.limit_in_bytes); \
        grep ' /sys/fs/cgroup/memory ' /proc/self/mountinfo | cut -d' ' -f6; \
        sleep 30";
    env.rt.block_on(async {
        let mut config = busybox_sh("cgview", script);
        config.resources.memory_limit_bytes = Some(64 << 20);
        config.resources.pids_limit = Some(20);
        let (sandbox, id) = start_one(env, &config).await?;
        let status = env.runtime.container_status(&id).await?;
        // Five lines on stdout, and sh's two complaints on stderr.
        let lines = log_lines(&status.log_path, 7).await;
        let text: Vec<&str> = lines
            .iter()
            .filter(|(stream, _)| stream == "stdout")
            .map(|(_, l)| l.as_str())
            .collect();
        let host_mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        cleanup(env, &sandbox).await?;
        ensure!(
            text.first() == Some(&"limit=67108864 pids=20"),
            "the container's own limits should show: {text:?}"
        );
        ensure!(
            text.contains(&"pids-write=1") && text.contains(&"memory-write=1"),
            "writes to the limits should fail: {text:?}"
        );
        ensure!(
            text.contains(&"after=20 67108864"),
            "limits changed: {text:?}"
        );
        let options = text.get(4).copied().unwrap_or_default();
        ensure!(
            ["ro", "nosuid", "nodev", "noexec"]
                .iter()
                .all(|o| options.split(',').any(|x| x == *o)),
            "mount options of /sys/fs/cgroup/memory: {options:?}"
        );
        ensure!(
            !host_mounts.contains(ironlet_runtime::zygote::cgroup_view::VIEW_DIR),
            "the view's mounts reached the host's mount table"
        );
        Ok(())
    })
}

fn status_after_exit_has_whole_log(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        // 512 KiB of 64-byte lines written at once (cat fills the pipe, then exits): the
        // pump still has up to a pipe's worth (64 KiB, a thousand records) to write when the
        // exit is seen. Not two-byte lines: 32 000 records left could take the pump longer
        // than the status read waits for it (2 s) on a loaded machine with a debug build.
        let script = "yes 012345678901234567890123456789012345678901234567890123456789012 \
                      | head -c 524288 > /tmp/f; echo end >> /tmp/f; cat /tmp/f; exit 1";
        let (sandbox, id) = start_one(env, &busybox_sh("chatty", script)).await?;
        let status = wait_exit(env, &id, 30).await?;
        // No polling: the file must be complete when the status says the container exited.
        let text = std::fs::read_to_string(&status.log_path)?;
        let last = text
            .lines()
            .rev()
            .find_map(ironlet_runtime::local::logs::parse_record)
            .map(|(_, _, line)| line.to_owned());
        cleanup(env, &sandbox).await?;
        ensure!(
            last.as_deref() == Some("end"),
            "last log line when the exit was reported: {last:?}"
        );
        Ok(())
    })
}

fn seccomp_eperm(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        // `unshare` is not in the RuntimeDefault allow-list without CAP_SYS_ADMIN.
        let script = "unshare -U true 2>&1; echo rc=$?";
        let (s1, confined) = start_one(env, &busybox_sh("confined", script)).await?;
        let mut open = busybox_sh("unconfined", script);
        open.security.seccomp = SeccompProfile::Unconfined;
        let (s2, unconfined) = start_one(env, &open).await?;
        let a = wait_exit(env, &confined, 20).await?;
        let b = wait_exit(env, &unconfined, 20).await?;
        let la = log_lines(&a.log_path, 1).await;
        let lb = log_lines(&b.log_path, 1).await;
        let text_a: String = la.iter().map(|(_, l)| format!("{l}\n")).collect();
        let text_b: String = lb.iter().map(|(_, l)| format!("{l}\n")).collect();
        ensure!(
            text_a.contains("Operation not permitted"),
            "confined: {text_a}"
        );
        ensure!(!text_a.contains("rc=0"), "confined: {text_a}");
        ensure!(text_b.contains("rc=0"), "unconfined: {text_b}");
        cleanup(env, &s1).await?;
        cleanup(env, &s2).await
    })
}

/// `allowPrivilegeEscalation` unset (kubelet: no `no_new_privs`) with the RuntimeDefault
/// profile: the filter must go in while the process still has CAP_SYS_ADMIN. It used to be
/// loaded after the capabilities were dropped, and the create failed with "failed to load
/// seccomp context".
fn seccomp_without_no_new_privs(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let script = concat!(
            "grep -E '^(CapPrm|CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; ",
            "unshare -U true 2>&1; echo rc=$?; sleep 60"
        );
        let mut c = busybox_sh("escalating", script);
        c.security.no_new_privs = false;
        c.security.seccomp = SeccompProfile::RuntimeDefault;
        let (sandbox, id) = start_one(env, &c).await?;
        let checked = async {
            let st = env.runtime.container_status(&id).await?;
            let lines = log_lines(&st.log_path, 7).await;
            let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
            ensure!(text.contains("NoNewPrivs:\t0\n"), "{text}");
            ensure!(text.contains("Seccomp:\t2\n"), "not filtered: {text}");
            ensure!(
                text.contains("Operation not permitted") && !text.contains("rc=0"),
                "unshare escaped the profile: {text}"
            );
            // An exec'd process gets the same profile, without `no_new_privs` as runc runs
            // it, and none of the capabilities it held to install the filter (the zygote
            // installs the copy, libcontainer does not).
            let out = exec_10s(
                env,
                &id,
                &[
                    "grep",
                    "-E",
                    "^(CapPrm|CapEff|CapBnd|NoNewPrivs|Seccomp):",
                    "/proc/self/status",
                ],
            )
            .await?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let init: String = lines
                .iter()
                .filter(|(_, l)| {
                    l.starts_with("Cap") || l.starts_with("NoNewPrivs") || l.starts_with("Seccomp")
                })
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            ensure!(
                out.exit_code == 0 && stdout == init,
                "exec: {out:?}, the container's init: {init}"
            );
            Ok(())
        }
        .await;
        cleanup(env, &sandbox).await?;
        checked
    })
}

/// An exec'd process (exec probes, `kubectl exec`, exec hooks) is the container's process
/// with other arguments, as runc runs it: its user and groups, and `no_new_privs` exactly
/// when the container has it (kubelet: `allowPrivilegeEscalation: false`). It used to be
/// root and always `no_new_privs`, so a setuid binary run by exec could not escalate in a
/// container allowed to.
fn exec_follows_the_container(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        for (nnp, seccomp) in [
            (false, SeccompProfile::Unconfined),
            (true, SeccompProfile::Unconfined),
            (true, SeccompProfile::RuntimeDefault),
        ] {
            let mut c = busybox_sh(&format!("exec-nnp-{nnp}"), "sleep 60");
            c.security.no_new_privs = nnp;
            c.security.seccomp = seccomp.clone();
            c.security.run_as_user = Some(1000);
            c.security.run_as_group = Some(3000);
            c.security.supplemental_groups = vec![4000];
            c.env = vec![("FROM_SPEC".into(), "spec".into())];
            let (sandbox, id) = start_one(env, &c).await?;
            let script = "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; \
                          echo \"$(id -u) $(id -g) $(id -G) $FROM_SPEC\"";
            let checked = exec_10s(env, &id, &["sh", "-c", script]).await;
            cleanup(env, &sandbox).await?;
            let out = checked?;
            let want = format!(
                "NoNewPrivs:\t{}\nSeccomp:\t{}\n1000 3000 3000 4000 spec\n",
                u8::from(nnp),
                if seccomp == SeccompProfile::RuntimeDefault {
                    2
                } else {
                    0
                },
            );
            ensure!(
                out.exit_code == 0 && String::from_utf8_lossy(&out.stdout) == want,
                "no_new_privs {nnp}, {seccomp:?}: {out:?}, want {want:?}"
            );
        }
        Ok(())
    })
}

/// An exec'd process (the zygote joins the container itself, `zygote::join`) is in every
/// namespace and cgroup of the container's init, as the init itself sees them.
fn exec_joins_the_container(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let (sandbox, id) = start_one(env, &busybox_sh("exec-join", "sleep 60")).await?;
        let script = "for ns in pid mnt net uts ipc cgroup; do \
                        echo \"$ns $(readlink /proc/self/ns/$ns) $(readlink /proc/1/ns/$ns)\"; \
                      done; echo self; cat /proc/self/cgroup; echo init; cat /proc/1/cgroup";
        let checked = exec_10s(env, &id, &["sh", "-c", script]).await;
        cleanup(env, &sandbox).await?;
        let out = checked?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(out.exit_code == 0, "exec: {out:?}");
        let lines: Vec<&str> = text.lines().collect();
        for ns in ["pid", "mnt", "net", "uts", "ipc", "cgroup"] {
            let line = lines
                .iter()
                .find(|l| l.split(' ').next() == Some(ns))
                .with_context(|| format!("no {ns} line: {text}"))?;
            let fields: Vec<&str> = line.split(' ').collect();
            ensure!(
                fields.len() == 3 && fields[1].starts_with(ns) && fields[1] == fields[2],
                "the exec is not in the init's {ns} namespace: {line}"
            );
        }
        let (own, init) = text
            .split_once("self\n")
            .and_then(|(_, rest)| rest.split_once("init\n"))
            .with_context(|| format!("no cgroups: {text}"))?;
        ensure!(
            !own.trim().is_empty() && own == init,
            "the exec's cgroups {own:?} are not the init's {init:?}"
        );
        Ok(())
    })
}

fn exec_output(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let (sandbox, id) = start_one(env, &busybox_sh("exec", "sleep 60")).await?;
        let out = exec_10s(env, &id, &["sh", "-c", "echo hi; echo oops >&2; exit 7"]).await?;
        ensure!(
            out.stdout == b"hi\n",
            "stdout {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        ensure!(
            out.stderr == b"oops\n",
            "stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(out.exit_code == 7, "exit code {}", out.exit_code);
        // Exec'd processes run under the container's seccomp profile too.
        let out = exec_10s(env, &id, &["unshare", "-U", "true"]).await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.exit_code != 0 && err.contains("Operation not permitted"),
            "exec escaped seccomp: {err}"
        );
        let slow: Vec<String> = ["sleep", "30"].map(String::from).to_vec();
        let started = Instant::now();
        let timed_out = env
            .runtime
            .exec_sync(&id, &slow, Some(Duration::from_millis(500)))
            .await;
        ensure!(
            timed_out.is_err(),
            "a 30 s exec finished within a 0.5 s timeout"
        );
        ensure!(started.elapsed() < Duration::from_secs(5));
        let st = env.runtime.container_status(&id).await?;
        ensure!(
            st.state == ContainerState::Running,
            "exec disturbed the container: {st:?}"
        );
        cleanup(env, &sandbox).await
    })
}

fn exec_streaming(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let (sandbox, id) = start_one(env, &busybox_sh("stream", "sleep 60")).await?;
        let result = async {
            let cat = ExecRequest {
                cmd: vec!["cat".into()],
                stdin: true,
                tty: false,
            };
            let mut session = env.runtime.exec(&id, &cat).await?;
            let mut stdin = session.stdin.take().context("a stdin was asked for")?;
            stdin.write_all(b"ping\n").await?;
            drop(stdin);
            let mut out = Vec::new();
            tokio::time::timeout(
                Duration::from_secs(10),
                session.stdout.read_to_end(&mut out),
            )
            .await
            .context("cat never saw end-of-file")??;
            ensure!(
                out == b"ping\n",
                "stdout {:?}",
                String::from_utf8_lossy(&out)
            );
            let code = tokio::time::timeout(Duration::from_secs(10), session.exit.wait()).await?;
            ensure!(code == Some(0), "exit {code:?}");

            // Without stdin the process reads /dev/null; a non-zero code comes back.
            let fail = ExecRequest {
                cmd: ["sh", "-c", "cat; echo e >&2; exit 4"]
                    .map(String::from)
                    .to_vec(),
                stdin: false,
                tty: false,
            };
            let mut session = env.runtime.exec(&id, &fail).await?;
            ensure!(session.stdin.is_none());
            let mut err = Vec::new();
            session.stderr.read_to_end(&mut err).await?;
            ensure!(err == b"e\n", "stderr {:?}", String::from_utf8_lossy(&err));
            ensure!(session.exit.wait().await == Some(4));

            // Dropped mid-run: the shell and the sleep it forked both die.
            let marker = format!("{}", 700 + std::process::id() % 200);
            let script = format!("sleep {marker}; true");
            let tree = ExecRequest {
                cmd: ["sh", "-c", &script].map(String::from).to_vec(),
                stdin: false,
                tty: false,
            };
            let session = env.runtime.exec(&id, &tree).await?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while processes_with_cmdline(&["sleep", &marker]).is_empty() {
                ensure!(Instant::now() < deadline, "the exec'd sleep never ran");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            drop(session);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !processes_with_cmdline(&["sleep", &marker]).is_empty()
                || !processes_with_cmdline(&["sh", "-c", &script]).is_empty()
            {
                ensure!(
                    Instant::now() < deadline,
                    "the exec'd processes outlived the session"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let st = env.runtime.container_status(&id).await?;
            ensure!(
                st.state == ContainerState::Running,
                "the container died: {st:?}"
            );
            Ok(())
        }
        .await;
        cleanup(env, &sandbox).await?;
        result
    })
}

fn fifty_concurrent(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..50 {
            let runtime = env.runtime.clone();
            let sb = sandbox_config(env, &format!("c{i}"));
            tasks.push(tokio::spawn(async move {
                let sandbox = runtime.run_pod_sandbox(&sb).await?;
                let id = runtime
                    .create_container(
                        &sandbox,
                        &busybox_sh(&format!("c{i}"), &format!("echo n={i}")),
                    )
                    .await?;
                runtime.start_container(&id).await?;
                let status = runtime.wait(&id).await?;
                anyhow::Ok((sandbox, status))
            }));
        }
        let all = tokio::time::timeout(Duration::from_secs(120), futures_join(tasks))
            .await
            .context(
                "50 concurrent containers did not all finish in 120 s: a create or start hangs",
            )?;
        for (i, result) in all.into_iter().enumerate() {
            let (sandbox, status) = result??;
            if status.exit_code != Some(0) {
                bail!("container {i} ended with {:?}", status.exit_code);
            }
            let lines = log_lines(&status.log_path, 1).await;
            ensure!(
                lines.iter().any(|(_, l)| *l == format!("n={i}")),
                "container {i} log {lines:?}"
            );
            cleanup(env, &sandbox).await?;
        }
        Ok(())
    })
}

async fn futures_join<T>(
    tasks: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

fn stop_grace(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let script = "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.1; done";
        let (sandbox, id) = start_one(env, &busybox_sh("stubborn", script)).await?;
        let st = env.runtime.container_status(&id).await?;
        log_lines(&st.log_path, 1).await;
        let started = Instant::now();
        env.runtime
            .stop_container(&id, Duration::from_secs(2))
            .await?;
        let took = started.elapsed();
        ensure!(
            took >= Duration::from_millis(1900),
            "SIGKILL came early: {took:?}"
        );
        ensure!(took < Duration::from_secs(4), "SIGKILL came late: {took:?}");
        let status = env.runtime.container_status(&id).await?;
        ensure!(status.exit_code == Some(137), "exit {:?}", status.exit_code);
        let lines = log_lines(&status.log_path, 2).await;
        ensure!(
            lines.iter().any(|(_, l)| l == "got-term"),
            "no SIGTERM seen: {lines:?}"
        );

        // A container that honours SIGTERM stops at once.
        let (sandbox2, id2) = start_one(
            env,
            &busybox_sh(
                "polite",
                "trap 'exit 0' TERM; while true; do sleep 0.1; done",
            ),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        env.runtime
            .stop_container(&id2, Duration::from_secs(10))
            .await?;
        ensure!(
            started.elapsed() < Duration::from_secs(2),
            "stop waited {:?}",
            started.elapsed()
        );
        let status = env.runtime.container_status(&id2).await?;
        ensure!(status.exit_code == Some(0), "exit {:?}", status.exit_code);
        cleanup(env, &sandbox).await?;
        cleanup(env, &sandbox2).await
    })
}

fn sandbox_sharing(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let sandbox = env
            .runtime
            .run_pod_sandbox(&sandbox_config(env, "shared"))
            .await?;
        let probe = "readlink /proc/self/ns/net; readlink /proc/self/ns/uts; hostname";
        let a = env
            .runtime
            .create_container(&sandbox, &busybox_sh("a", probe))
            .await?;
        let b = env
            .runtime
            .create_container(&sandbox, &busybox_sh("b", probe))
            .await?;
        env.runtime.start_container(&a).await?;
        env.runtime.start_container(&b).await?;
        let sa = wait_exit(env, &a, 20).await?;
        let sb = wait_exit(env, &b, 20).await?;
        let la = log_lines(&sa.log_path, 3).await;
        let lb = log_lines(&sb.log_path, 3).await;
        ensure!(
            la.len() == 3 && la == lb,
            "namespaces differ: {la:?} vs {lb:?}"
        );
        ensure!(la[2].1 == "shared", "hostname {:?}", la[2].1);
        let host_net = std::fs::read_link("/proc/self/ns/net")?;
        ensure!(
            la[0].1 != host_net.to_string_lossy(),
            "the pod uses the host network"
        );
        cleanup(env, &sandbox).await
    })
}

fn removal_cleans_up(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut config = busybox_sh("tidy", "sleep 60");
        config.resources.memory_limit_bytes = Some(64 << 20);
        let (sandbox, id) = start_one(env, &config).await?;
        let dir = env.root.join("containers").join(id.as_str());
        ensure!(dir.join("rootfs").exists(), "no rootfs at {dir:?}");
        let cg = format!(
            "/sys/fs/cgroup/memory/ironlet-test-{}/{}",
            std::process::id(),
            id
        );
        let v1 = Path::new("/sys/fs/cgroup/memory").exists();
        if v1 {
            ensure!(Path::new(&cg).exists(), "no memory cgroup {cg}");
        }
        cleanup(env, &sandbox).await?;
        ensure!(!dir.exists(), "container directory left: {dir:?}");
        if v1 {
            ensure!(!Path::new(&cg).exists(), "cgroup left: {cg}");
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        ensure!(!mounts.contains(id.as_str()), "a mount of {id} is left");
        ensure!(
            !mounts.contains(sandbox.as_str()),
            "a namespace mount of {sandbox} is left"
        );
        ensure!(!env.root.join("sandboxes").join(sandbox.as_str()).exists());
        Ok(())
    })
}

fn oom_score_adj_isolated(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let before = std::fs::read_to_string("/proc/self/oom_score_adj")?;
        let mut config = busybox_sh("adj", "cat /proc/self/oom_score_adj");
        config.resources.oom_score_adj = Some(999);
        let (sandbox, id) = start_one(env, &config).await?;
        let status = wait_exit(env, &id, 20).await?;
        let lines = log_lines(&status.log_path, 1).await;
        ensure!(
            lines.first().map(|l| l.1.as_str()) == Some("999"),
            "container saw {lines:?}"
        );
        let after = std::fs::read_to_string("/proc/self/oom_score_adj")?;
        ensure!(
            before == after,
            "caller's oom_score_adj changed from {before} to {after}"
        );
        cleanup(env, &sandbox).await
    })
}

fn missing_image(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let sandbox = env
            .runtime
            .run_pod_sandbox(&sandbox_config(env, "noimage"))
            .await?;
        let mut config = busybox_sh("x", "true");
        config.image = "does-not-exist:1".into();
        let err = env.runtime.create_container(&sandbox, &config).await;
        let Err(err) = err else {
            bail!("create succeeded without an image")
        };
        ensure!(
            err.kubelet_reason() == "ErrImageNeverPull" || err.kubelet_reason() == "ErrImagePull",
            "reason {}",
            err.kubelet_reason()
        );
        // Other tests run concurrently: look for anything of this sandbox, on disk too.
        let filter = ironlet_runtime::types::ContainerFilter {
            sandbox_id: Some(sandbox.clone()),
            ..Default::default()
        };
        ensure!(
            env.runtime.list_containers(&filter).await?.is_empty(),
            "create left a container"
        );
        for dir in std::fs::read_dir(env.root.join("containers"))? {
            let record =
                std::fs::read_to_string(dir?.path().join("record.json")).unwrap_or_default();
            ensure!(
                !record.contains(sandbox.as_str()),
                "create left a directory behind"
            );
        }
        cleanup(env, &sandbox).await
    })
}

/// The id of the container whose record names `sandbox`, once its create has written it.
fn record_of_sandbox(root: &Path, sandbox: &SandboxId) -> Option<String> {
    std::fs::read_dir(root.join("containers"))
        .ok()?
        .flatten()
        .find(|d| {
            std::fs::read_to_string(d.path().join("record.json"))
                .is_ok_and(|r| r.contains(sandbox.as_str()))
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
}

/// The soak's leak: a pod killed while one of its containers was being created lost its
/// sandbox, then the create completed and registered a running container that belonged to
/// no pod (nothing stops it: clean-up goes sandbox by sandbox), with its record, rootfs
/// mount and processes. Now the create is refused once the sandbox is stopped or gone, and
/// its container undone. The removal runs as soon as the create has written its first
/// record, so it ends while the create is still under way; that interleaving must happen in
/// at least one of the attempts.
fn create_racing_sandbox_removal(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut raced = 0;
        for attempt in 0..5 {
            // Host network and IPC: no namespace files to join, whose removal would fail the
            // create by itself; the removal is then all the runtime has to go by.
            let sandbox = env
                .runtime
                .run_pod_sandbox(&PodSandboxConfig {
                    host_network: true,
                    host_ipc: true,
                    ..sandbox_config(env, &format!("race{attempt}"))
                })
                .await?;
            let config = busybox_sh("c", "sleep 3600");
            let create = async {
                let result = env.runtime.create_container(&sandbox, &config).await;
                (result, Instant::now())
            };
            let remove = async {
                let deadline = Instant::now() + Duration::from_secs(20);
                let id = loop {
                    if let Some(id) = record_of_sandbox(&env.root, &sandbox) {
                        break Some(id);
                    }
                    if Instant::now() > deadline {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                };
                env.runtime.stop_pod_sandbox(&sandbox).await?;
                env.runtime.remove_pod_sandbox(&sandbox).await?;
                anyhow::Ok((id, Instant::now()))
            };
            let ((created, create_done), removed) = tokio::join!(create, remove);
            let (id, remove_done) = removed?;
            let id = id.context("the create never wrote its record")?;
            if remove_done < create_done {
                raced += 1;
                ensure!(
                    created.is_err(),
                    "a create that ended after its sandbox's removal succeeded: {created:?}"
                );
            }
            // Whichever ended first, nothing of the container may stay.
            let all = ironlet_runtime::types::ContainerFilter::default();
            let listed = env.runtime.list_containers(&all).await?;
            ensure!(
                !listed.iter().any(|c| c.sandbox_id == sandbox),
                "a container of the removed sandbox is still listed: {listed:?}"
            );
            ensure!(
                !env.root.join("containers").join(&id).exists(),
                "the container's directory {id} is left"
            );
            let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
            ensure!(!mounts.contains(&id), "a mount of container {id} is left");
            let in_cgroup = std::fs::read_dir("/proc")?.flatten().any(|p| {
                std::fs::read_to_string(p.path().join("cgroup")).is_ok_and(|c| c.contains(&id))
            });
            ensure!(!in_cgroup, "a process of container {id} is left");
        }
        ensure!(
            raced > 0,
            "the sandbox's removal never ended before the create: the race was not exercised"
        );
        Ok(())
    })
}

/// Reads `reader` until `want` shows up in what was read (or 10 s pass); returns it all.
async fn read_until(
    reader: &mut ironlet_runtime::types::ExecReader,
    seen: &mut Vec<u8>,
    want: &str,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(seen).contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, reader.read(&mut buf))
            .await
            .with_context(|| {
                format!(
                    "waiting for {want:?}, got {:?}",
                    String::from_utf8_lossy(seen)
                )
            })??;
        ensure!(
            n > 0,
            "end of output before {want:?}: {:?}",
            String::from_utf8_lossy(seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// A container with `tty` and `stdin` running an interactive shell: attach writes a
/// command and sees its output, a resize is what `stty size` reports, the output is in
/// the CRI log (one stream, stdout), and an exec with its own terminal gets a tty, is
/// resized and exits with its code.
fn tty_attach_and_exec(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut config = busybox_sh("tty", "exec sh -i");
        config.stdin = true;
        config.tty = true;
        let (sandbox, id) = start_one(env, &config).await?;
        let result = async {
            let attach = ExecRequest {
                cmd: Vec::new(),
                stdin: true,
                tty: true,
            };
            let mut session = env.runtime.attach(&id, &attach).await?;
            let resize = session.resize.take().context("a tty session can resize")?;
            resize(91, 27)?;
            let mut stdin = session.stdin.take().context("stdin")?;
            stdin
                .write_all(
                    b"echo tty-$((6*7)); [ -t 1 ] || echo NOT-A-TTY; stty size; echo $TERM\n",
                )
                .await?;
            let mut seen = Vec::new();
            read_until(&mut session.stdout, &mut seen, "27 91").await?;
            let text = String::from_utf8_lossy(&seen).into_owned();
            ensure!(text.contains("tty-42\r\n"), "{text:?}");
            ensure!(!text.contains("NOT-A-TTY\r"), "{text:?}");
            read_until(&mut session.stdout, &mut seen, "xterm").await?;
            // Leaving the session leaves the container running.
            drop(stdin);
            drop(session);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let st = env.runtime.container_status(&id).await?;
            ensure!(st.state == ContainerState::Running, "{st:?}");

            // An exec on its own terminal: job control shell, size, exit code.
            let exec = ExecRequest {
                cmd: vec!["sh".into()],
                stdin: true,
                tty: true,
            };
            let mut session = env.runtime.exec(&id, &exec).await?;
            let resize = session.resize.take().context("resize")?;
            resize(120, 40)?;
            let mut stdin = session.stdin.take().context("stdin")?;
            stdin
                .write_all(b"stty size; [ -t 0 ] && echo IS-$((1+1))-TTY\n")
                .await?;
            let mut seen = Vec::new();
            read_until(&mut session.stdout, &mut seen, "IS-2-TTY\r\n").await?;
            ensure!(
                String::from_utf8_lossy(&seen).contains("40 120"),
                "{:?}",
                String::from_utf8_lossy(&seen)
            );
            stdin.write_all(b"exit 3\n").await?;
            let code = tokio::time::timeout(Duration::from_secs(10), session.exit.wait()).await?;
            ensure!(code == Some(3), "exit {code:?}");

            // The attached shell's output went to the log as stdout.
            let log = {
                let st = env.runtime.container_status(&id).await?;
                st.log_path
            };
            let lines = log_lines(&log, 1).await;
            ensure!(
                lines
                    .iter()
                    .any(|(s, l)| s == "stdout" && l.contains("tty-42")),
                "{lines:?}"
            );
            ensure!(lines.iter().all(|(s, _)| s == "stdout"), "{lines:?}");
            Ok(())
        }
        .await;
        cleanup(env, &sandbox).await?;
        result
    })
}

/// `stdin` + `stdinOnce` without a tty: what the first attach writes reaches the
/// container, and when that session ends the container reads end-of-file.
fn stdin_once_attach(env: &Env) -> Result<()> {
    env.rt.block_on(async {
        let mut config = busybox_sh("once", "cat; echo got-eof; sleep 60");
        config.stdin = true;
        config.stdin_once = true;
        let (sandbox, id) = start_one(env, &config).await?;
        let result = async {
            let attach = ExecRequest {
                cmd: Vec::new(),
                stdin: true,
                tty: false,
            };
            let mut session = env.runtime.attach(&id, &attach).await?;
            ensure!(session.resize.is_none());
            let mut stdin = session.stdin.take().context("stdin")?;
            stdin.write_all(b"line-one\n").await?;
            let mut seen = Vec::new();
            read_until(&mut session.stdout, &mut seen, "line-one\n").await?;
            drop(stdin);
            drop(session);
            let st = env.runtime.container_status(&id).await?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let lines = log_lines(&st.log_path, 1).await;
                if lines.iter().any(|(_, l)| l == "got-eof") {
                    break;
                }
                ensure!(Instant::now() < deadline, "no end-of-file: {lines:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // stdinOnce: a second attach gets no stdin.
            ensure!(env.runtime.attach(&id, &attach).await.is_err());
            Ok(())
        }
        .await;
        cleanup(env, &sandbox).await?;
        result
    })
}

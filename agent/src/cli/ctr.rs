//! `ironlet ctr run|ps|logs|exec|rm`: containers from the command line, crictl/podman
//! style, on the same in-process runtime the agent uses.
//!
//! Each container made by `ctr run` gets a sandbox of its own in the `ironlet-ctr`
//! namespace; `ctr rm` removes the sandbox with its last container. `ctr run` takes
//! docker/podman flag names (`-d`, `-v`, `-w`, `-u`, `-e`, `--cpus`, `--memory`, `--pids`,
//! `--rm`); `flags` parses their values, `detach` runs a `-d` container from a monitor
//! process, `logs` prints and follows log files.

pub(super) mod detach;
mod flags;
mod logs;
mod terminal;

use super::output::{outln, stdout_error};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ironlet_runtime::local::logs::LogStream;
use ironlet_runtime::types::{
    ContainerConfig, ContainerFilter, ContainerId, ContainerState, ContainerStatus, ExecRequest,
    LinuxResources, Mount, PodSandboxConfig, PortMapping, SandboxId,
};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};
use tokio::io::AsyncWriteExt;

/// The sandbox namespace of containers made by `ctr run`.
use ironlet::kubelet::CTR_NAMESPACE;

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of `RunArgs` costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum CtrCommand {
    /// Run a container: in the foreground (exits with the container's exit code), or with
    /// -d in the background (prints its id).
    Run(RunArgs),
    /// List containers.
    Ps {
        /// Show all containers, not only running ones.
        #[arg(short, long)]
        all: bool,
        /// Only print container ids.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Print a container's logs.
    Logs {
        /// Follow the output until the container exits.
        #[arg(short, long)]
        follow: bool,
        id: String,
    },
    /// Stop running containers: SIGTERM, then SIGKILL after the timeout.
    Stop {
        /// Seconds to wait after SIGTERM before SIGKILL.
        #[arg(short = 't', long = "time", default_value_t = 10)]
        time: u64,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Run a command in a running container.
    Exec {
        /// Keep stdin open and feed it to the command.
        #[arg(short, long)]
        interactive: bool,
        /// Run the command on a terminal (the local one goes raw and its size follows).
        #[arg(short, long)]
        tty: bool,
        id: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Remove containers.
    Rm {
        /// Kill running containers first.
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run in the background and print the container id (then `ctr logs -f`, `ctr stop`).
    #[arg(short, long)]
    pub detach: bool,
    /// Keep the container's stdin open and feed it this process's stdin.
    #[arg(short, long, conflicts_with = "detach")]
    pub interactive: bool,
    /// Run the container on a terminal (the local one goes raw and its size follows).
    #[arg(short, long, conflicts_with = "detach")]
    pub tty: bool,
    /// Bind mount a host path: HOST:CONTAINER[:ro|rw]; the host path must exist.
    #[arg(short = 'v', long = "volume", value_parser = flags::parse_volume)]
    pub volumes: Vec<Mount>,
    /// Working directory inside the container (absolute).
    #[arg(short = 'w', long, value_parser = flags::parse_workdir)]
    pub workdir: Option<String>,
    /// Run as UID[:GID] (numeric).
    #[arg(short, long, value_parser = flags::parse_user)]
    pub user: Option<(u32, Option<u32>)>,
    /// CPU limit in CPUs, e.g. 1.5 (a CFS quota over a 100 ms period).
    #[arg(long, value_parser = flags::parse_cpus, value_name = "CPUS")]
    pub cpus: Option<i64>,
    /// Memory limit, e.g. 64m, 1g or bytes.
    #[arg(long, value_parser = flags::parse_bytes)]
    pub memory: Option<i64>,
    /// Maximum number of processes.
    #[arg(long)]
    pub pids: Option<i64>,
    /// Run in a user namespace as the invoking user (implied when not root).
    #[arg(long)]
    pub rootless: bool,
    /// Container name (default: derived from the image).
    #[arg(long)]
    pub name: Option<String>,
    /// Remove the container when it exits.
    #[arg(long)]
    pub rm: bool,
    /// Use the host's network namespace.
    #[arg(long = "net-host")]
    pub net_host: bool,
    /// Cgroup under which the container's cgroup is made, as root (podman's
    /// `--cgroup-parent`).
    #[arg(
        long = "cgroup-parent",
        value_name = "PATH",
        default_value = "/ironlet"
    )]
    pub cgroup_parent: String,
    /// Publish a container port on the host: [IP:]HOST:CTR[/tcp|udp].
    #[arg(short = 'p', long = "publish", value_parser = flags::parse_publish)]
    pub publish: Vec<PortMapping>,
    /// Override the image's entrypoint.
    #[arg(long)]
    pub entrypoint: Option<String>,
    /// Environment variables: KEY=VALUE, or KEY for ironlet's own value of KEY.
    #[arg(short, long = "env")]
    pub env: Vec<String>,
    /// Make the root filesystem read-only.
    #[arg(long)]
    pub read_only: bool,
    pub image: String,
    /// Command and arguments (replace the image's CMD).
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(root_flag: Option<PathBuf>, cmd: CtrCommand) -> anyhow::Result<ExitCode> {
    let mut reporter = detach::Reporter::from_env();
    if matches!(&cmd, CtrCommand::Run(a) if a.detach) && reporter.is_none() {
        // The monitor's stderr is /dev/null: the caller says what it would have said.
        if super::running_rootless() {
            warn_rootless_limits();
        }
        return detach::launch();
    }
    let result = run_here(root_flag, cmd, reporter.as_mut());
    if let (Err(err), Some(reporter)) = (&result, reporter.as_mut()) {
        reporter.failed(err);
    }
    result
}

fn run_here(
    root_flag: Option<PathBuf>,
    cmd: CtrCommand,
    reporter: Option<&mut detach::Reporter>,
) -> anyhow::Result<ExitCode> {
    let rootless = super::running_rootless() || matches!(&cmd, CtrCommand::Run(a) if a.rootless);
    if rootless && !super::running_rootless() {
        bail!("--rootless runs containers as the invoking user; run it as an unprivileged user");
    }
    let root_dir = super::root_dir(&root_flag, rootless);
    if matches!(&cmd, CtrCommand::Run(a) if a.rm) {
        // Everything this run writes about its container goes before it exits: no fsyncs
        // (the zygote forked below inherits this).
        ironlet_runtime::fsutil::set_state_throwaway();
    }
    // The zygote must exist before any thread: tokio starts below.
    let zygote = ironlet_runtime::zygote::spawn().context("starting the zygote")?;
    let zygote_pid = zygote.pid;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(async move {
        let images = super::open_images(&root_dir)?;
        if rootless {
            warn_rootless_limits();
        }
        let config = LocalRuntimeConfig {
            root_dir: root_dir.clone(),
            rootless,
            // Rootless: below the delegated cgroup v2 subtree, if there is one (the runtime
            // puts it there, or gives no cgroup).
            default_cgroup_parent: Some(match &cmd {
                CtrCommand::Run(args) => args.cgroup_parent.clone(),
                _ => "/ironlet".to_owned(),
            }),
            cni: pod_network(&cmd, rootless),
            log_rotation: Default::default(),
        };
        let runtime = LocalRuntime::new(config, zygote, images)
            .await
            .with_context(|| format!("opening the runtime at {}", root_dir.display()))?;
        match cmd {
            CtrCommand::Run(args) => {
                // pasta connects the pod's network while the container is created.
                runtime.network_ready_at_start();
                run_container(&runtime, args, reporter).await
            }
            CtrCommand::Ps { all, quiet } => ps(&runtime, all, quiet).await,
            CtrCommand::Logs { follow, id } => {
                let status = resolve(&runtime, &id).await?;
                logs::print(&runtime, &status, follow).await?;
                Ok(ExitCode::SUCCESS)
            }
            CtrCommand::Stop { time, ids } => stop(&runtime, Duration::from_secs(time), ids).await,
            CtrCommand::Exec {
                interactive,
                tty,
                id,
                command,
            } if interactive || tty => {
                exec_interactive(&runtime, &id, command, interactive, tty).await
            }
            CtrCommand::Exec { id, command, .. } => exec(&runtime, &id, command).await,
            CtrCommand::Rm { force, ids } => rm(&runtime, force, ids).await,
        }
    });
    // Dropping the async runtime closes the zygote's connection; it exits once the last
    // process it reaps has ended (none is left after a `--rm` run, nor after any other
    // command). Waiting for it means that when this command exits, none of its processes
    // is left.
    drop(rt);
    wait_for_zygote(zygote_pid);
    result
}

/// How long a command waits for its zygote to exit.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Reaps this process's zygote (pid `pid`), waiting at most [`ZYGOTE_EXIT_WAIT`].
fn wait_for_zygote(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(pid);
    let deadline = std::time::Instant::now() + ZYGOTE_EXIT_WAIT;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(WaitStatus::StillAlive) => {
                tracing::debug!(
                    pid = pid.as_raw(),
                    "the zygote still reaps; not waiting longer"
                );
                return;
            }
            _ => return,
        }
    }
}

/// Whether `ctr` containers get a pod network: rootless always (pasta; `--net-host` opts
/// out), as root only with `-p` (ironlet's own CNI network `ironlet`, whatever else
/// `/etc/cni/net.d` holds, with its `portmap` publishing), else a loopback-only namespace.
/// Commands that may remove a sandbox (`rm`, `stop`) keep the CNI settings so that a root
/// container's address and port rules are released.
fn pod_network(cmd: &CtrCommand, rootless: bool) -> Option<ironlet_runtime::network::CniConfig> {
    let wanted = match cmd {
        CtrCommand::Run(args) => rootless || !args.publish.is_empty(),
        _ => true,
    };
    wanted.then(|| ironlet_runtime::network::CniConfig {
        choice: ironlet_runtime::network::NetworkChoice::IronletDefault,
        ..Default::default()
    })
}

fn warn_rootless_limits() {
    let delegated = ironlet_cgroups::Hierarchy::detect()
        .ok()
        .map(|h| ironlet_cgroups::Delegation::detect(&h).is_full())
        .unwrap_or(false);
    if !delegated {
        eprintln!(
            "ironlet: rootless without a delegated cgroup v2 subtree: resource limits \
             (--cpus, --memory, --pids) are NOT enforced"
        );
    }
}

fn default_name(image: &str) -> String {
    let base = image.rsplit('/').next().unwrap_or(image);
    let base = base.split(['@', ':']).next().unwrap_or(base);
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "ctr".to_owned()
    } else {
        cleaned
    }
}

/// The container's environment from `-e`: KEY=VALUE, or KEY with this process's value.
fn env_of(args: &RunArgs) -> anyhow::Result<Vec<(String, String)>> {
    let host = |key: &str| std::env::var(key).ok();
    let mut env = Vec::new();
    for kv in &args.env {
        if let Some(pair) = flags::parse_env(kv, host).map_err(anyhow::Error::msg)? {
            env.push(pair);
        }
    }
    Ok(env)
}

async fn run_container(
    runtime: &LocalRuntime,
    args: RunArgs,
    detached: Option<&mut detach::Reporter>,
) -> anyhow::Result<ExitCode> {
    let env = env_of(&args)?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| default_name(&args.image));
    let pod_uid = ContainerId::random().to_string();
    let log_root = if runtime.config().rootless {
        runtime.config().root_dir.join("logs")
    } else {
        PathBuf::from("/var/log/pods")
    };
    if args.net_host && !args.publish.is_empty() {
        bail!("-p publishes ports of the container's own network; with --net-host its ports are the host's already");
    }
    let sandbox_config = PodSandboxConfig {
        pod_uid: pod_uid.clone(),
        name: name.clone(),
        namespace: CTR_NAMESPACE.to_owned(),
        hostname: name.clone(),
        host_network: args.net_host,
        port_mappings: args.publish.clone(),
        log_directory: log_root.join(format!("{CTR_NAMESPACE}_{name}_{pod_uid}")),
        ..PodSandboxConfig::default()
    };
    let sandbox = runtime
        .run_pod_sandbox(&sandbox_config)
        .await
        .context("creating the sandbox")?;
    let mut config = ContainerConfig {
        name: name.clone(),
        image: args.image.clone(),
        command: args.entrypoint.iter().cloned().collect(),
        args: args.command.clone(),
        env,
        working_dir: args.workdir.clone(),
        mounts: args.volumes.clone(),
        resources: LinuxResources {
            memory_limit_bytes: args.memory,
            pids_limit: args.pids,
            cpu_quota: args.cpus,
            cpu_period: args.cpus.map(|_| flags::CPU_PERIOD_US),
            ..LinuxResources::default()
        },
        log_path: PathBuf::from(format!("{name}/0.log")),
        labels: BTreeMap::from([("io.kubernetes.container.name".to_owned(), name.clone())]),
        stdin: args.interactive,
        // As docker: the container's stdin closes when ours does.
        stdin_once: args.interactive,
        tty: args.tty,
        ..ContainerConfig::default()
    };
    config.security.read_only_rootfs = args.read_only;
    if let Some((uid, gid)) = args.user {
        config.security.run_as_user = Some(uid);
        config.security.run_as_group = gid;
    }
    let log_dir = &sandbox_config.log_directory;
    let id = match runtime.create_container(&sandbox, &config).await {
        Ok(id) => id,
        Err(err) => {
            if let Err(cleanup) = remove_sandbox(runtime, &sandbox, log_dir).await {
                tracing::warn!(sandbox_id = %sandbox, err = %format!("{cleanup:#}"), "removing the sandbox of a failed run");
            }
            return Err(err).with_context(|| format!("creating container from {}", args.image));
        }
    };
    // A detached container's output goes to its log file only.
    let output = match detached {
        None => Some(runtime.tap_output(&id)?),
        Some(_) => None,
    };
    // Stdin and the window size go to the container from before its start.
    let session = if args.interactive || args.tty {
        let request = ExecRequest {
            cmd: Vec::new(),
            stdin: args.interactive,
            tty: args.tty,
        };
        Some(runtime.attach(&id, &request).await.context("attaching")?)
    } else {
        None
    };
    if let Err(err) = runtime.start_container(&id).await {
        if args.rm {
            if let Err(cleanup) = remove_all(runtime, &id, &sandbox, log_dir).await {
                tracing::warn!(container_id = %id, err = %format!("{cleanup:#}"), "removing a container that did not start");
            }
        }
        return Err(err).context("starting the container");
    }
    if let Some(reporter) = detached {
        reporter.started(&id);
        let status = runtime.wait(&id).await?;
        if args.rm {
            remove_all(runtime, &id, &sandbox, log_dir).await?;
        }
        return Ok(ExitCode::from(
            status.exit_code.unwrap_or(1).clamp(0, 255) as u8
        ));
    }
    let mut output = output.context("the container's output")?;
    let raw = if args.tty {
        terminal::RawMode::enter()
    } else {
        None
    };
    let interactive = session.map(|mut session| {
        // The output comes from the tap, complete from the start.
        session.stdout = Box::new(tokio::io::empty());
        session.stderr = Box::new(tokio::io::empty());
        let window = session.resize.take().map(terminal::follow_window_size);
        let input = session.stdin.take().map(|stdin| {
            // At end of input the session ends, which closes the container's stdin.
            let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
            let task = terminal::forward_stdin(stdin, move || {
                let _ = eof_tx.send(());
            });
            (task, eof_rx)
        });
        (session, window, input)
    });
    let (mut session, window, input) = match interactive {
        Some((session, window, input)) => (Some(session), window, input),
        None => (None, None, None),
    };
    let (input_task, mut eof) = match input {
        Some((task, eof)) => (Some(task), Some(eof)),
        None => (None, None),
    };
    let ended_input = async {
        match eof.as_mut() {
            Some(eof) => {
                let _ = eof.await;
            }
            None => std::future::pending().await,
        }
    };
    let copy = async {
        let mut stdout = tokio::io::stdout();
        let mut stderr = tokio::io::stderr();
        while let Some((stream, bytes)) = output.recv().await {
            let _ = match stream {
                LogStream::Stdout => stdout.write_all(&bytes).await,
                LogStream::Stderr => stderr.write_all(&bytes).await,
            };
            // A prompt has no newline: on a terminal it must show now.
            if args.tty {
                let _ = stdout.flush().await;
            }
        }
        let _ = stdout.flush().await;
        let _ = stderr.flush().await;
    };
    let run = async {
        let both = async { tokio::join!(copy, runtime.wait(&id)) };
        tokio::pin!(both);
        tokio::pin!(ended_input);
        let mut input_open = true;
        loop {
            tokio::select! {
                (_, status) = &mut both => break status,
                () = &mut ended_input, if input_open => {
                    input_open = false;
                    // Leaving the session closes the container's stdin (stdinOnce).
                    session.take();
                }
            }
        }
    };
    let status = tokio::select! {
        status = run => status?,
        _ = tokio::signal::ctrl_c() => {
            runtime.stop_container(&id, Duration::from_secs(10)).await?;
            runtime.wait(&id).await?
        }
    };
    for task in [window, input_task].into_iter().flatten() {
        task.abort();
    }
    drop(raw);
    let code = status.exit_code.unwrap_or(1);
    if let Some(reason) = status.reason.filter(|r| r.as_str() == "OOMKilled") {
        eprintln!("ironlet: container {} was {}", id.short(), reason.as_str());
    }
    if args.rm {
        remove_all(runtime, &id, &sandbox, log_dir).await?;
    } else {
        println_stderr_id(&id);
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Removes a `ctr run` container with its sandbox and log directory. The sandbox's removal
/// removes its one container, while it stops a rootless pod network.
async fn remove_all(
    runtime: &LocalRuntime,
    id: &ContainerId,
    sandbox: &SandboxId,
    log_dir: &Path,
) -> anyhow::Result<()> {
    remove_sandbox(runtime, sandbox, log_dir)
        .await
        .with_context(|| format!("removing container {}", id.short()))
}

/// Removes a `ctr run` sandbox and its log directory, which `ctr run` made for it: after
/// `--rm`, `ctr rm` or a failed run nothing of the container is left.
async fn remove_sandbox(
    runtime: &LocalRuntime,
    sandbox: &SandboxId,
    log_dir: &Path,
) -> anyhow::Result<()> {
    runtime
        .remove_pod_sandbox(sandbox)
        .await
        .with_context(|| format!("removing sandbox {}", sandbox.short()))?;
    // remove_dir_all does not follow symlinks: a link planted inside stays a link.
    match std::fs::remove_dir_all(log_dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("removing {}", log_dir.display())),
    }
}

fn println_stderr_id(id: &ContainerId) {
    tracing::info!(container_id = %id, "container kept; remove it with `ironlet ctr rm`");
}

/// Resolves a full id, a unique id prefix or a container name.
async fn resolve(runtime: &LocalRuntime, wanted: &str) -> anyhow::Result<ContainerStatus> {
    let all = runtime.list_containers(&ContainerFilter::default()).await?;
    let matches: Vec<_> = all
        .into_iter()
        .filter(|c| c.id.as_str().starts_with(wanted) || c.name == wanted)
        .collect();
    match matches.len() {
        0 => bail!("no such container: {wanted}"),
        1 => Ok(matches
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no such container"))?),
        n => bail!("{wanted} matches {n} containers; use a longer id"),
    }
}

fn ago(t: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match secs {
        0..=59 => format!("{secs} seconds ago"),
        60..=3599 => format!("{} minutes ago", secs / 60),
        3600..=86399 => format!("{} hours ago", secs / 3600),
        _ => format!("{} days ago", secs / 86400),
    }
}

async fn ps(runtime: &LocalRuntime, all: bool, quiet: bool) -> anyhow::Result<ExitCode> {
    let filter = ContainerFilter {
        state: (!all).then_some(ContainerState::Running),
        ..ContainerFilter::default()
    };
    let containers = runtime.list_containers(&filter).await?;
    if !quiet {
        outln!(
            "{:<14} {:<30} {:<16} {:<9} {:<20} {:<8} {:<14}",
            "CONTAINER",
            "IMAGE",
            "CREATED",
            "STATE",
            "NAME",
            "ATTEMPT",
            "POD ID"
        )?;
    }
    for c in containers.iter().rev() {
        if quiet {
            outln!("{}", c.id)?;
            continue;
        }
        let state = match (c.state, c.exit_code) {
            (ContainerState::Exited, Some(code)) => format!("Exited({code})"),
            (s, _) => s.as_str().to_owned(),
        };
        outln!(
            "{:<14} {:<30} {:<16} {:<9} {:<20} {:<8} {:<14}",
            c.id.short(),
            c.image,
            ago(c.created_at),
            state,
            c.name,
            c.attempt,
            c.sandbox_id.short()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn stop(
    runtime: &LocalRuntime,
    grace: Duration,
    ids: Vec<String>,
) -> anyhow::Result<ExitCode> {
    for_each_id(ids, |wanted| async move {
        let status = resolve(runtime, &wanted).await?;
        runtime
            .stop_container(&status.id, grace)
            .await
            .with_context(|| format!("stopping {}", status.id.short()))?;
        outln!("{}", status.id)
    })
    .await
}

/// Runs `each` for every id; failures are printed and make the exit code 1, except a
/// closed stdout, which ends the command.
async fn for_each_id<F, Fut>(ids: Vec<String>, mut each: F) -> anyhow::Result<ExitCode>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut failed = false;
    for wanted in ids {
        if let Err(err) = each(wanted).await {
            if super::output::is_stdout_closed(&err) {
                return Err(err);
            }
            eprintln!("ironlet: {err:#}");
            failed = true;
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn exec(runtime: &LocalRuntime, id: &str, command: Vec<String>) -> anyhow::Result<ExitCode> {
    let status = resolve(runtime, id).await?;
    let out = runtime
        .exec_sync(&status.id, &command, None)
        .await
        .with_context(|| format!("exec in {}", status.id.short()))?;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    stdout.write_all(&out.stdout).await.map_err(stdout_error)?;
    stderr.write_all(&out.stderr).await?;
    stdout.flush().await.map_err(stdout_error)?;
    stderr.flush().await?;
    Ok(ExitCode::from(out.exit_code.clamp(0, 255) as u8))
}

/// `ctr exec -i`/`-t`: the command's stdio streamed, on a terminal with `-t`.
async fn exec_interactive(
    runtime: &LocalRuntime,
    id: &str,
    command: Vec<String>,
    stdin: bool,
    tty: bool,
) -> anyhow::Result<ExitCode> {
    let status = resolve(runtime, id).await?;
    let request = ExecRequest {
        cmd: command,
        stdin,
        tty,
    };
    let session = runtime
        .exec(&status.id, &request)
        .await
        .with_context(|| format!("exec in {}", status.id.short()))?;
    let code = terminal::run_exec(session, tty).await.unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

async fn rm(runtime: &LocalRuntime, force: bool, ids: Vec<String>) -> anyhow::Result<ExitCode> {
    for_each_id(ids, |wanted| async move {
        let status = resolve(runtime, &wanted).await?;
        if status.state == ContainerState::Running && !force {
            bail!(
                "container {} is running; stop it first or use --force",
                status.id.short()
            );
        }
        runtime.remove_container(&status.id).await?;
        let left = runtime
            .list_containers(&ContainerFilter {
                sandbox_id: Some(status.sandbox_id.clone()),
                ..ContainerFilter::default()
            })
            .await?;
        if left.is_empty() {
            let sandbox = runtime.pod_sandbox_status(&status.sandbox_id).await.ok();
            if let Some(sandbox) = sandbox.filter(|s| s.config.namespace == CTR_NAMESPACE) {
                remove_sandbox(runtime, &status.sandbox_id, &sandbox.config.log_directory).await?;
            }
        }
        outln!("{}", status.id)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_come_from_the_image() {
        assert_eq!(default_name("docker.io/library/busybox:1.36"), "busybox");
        assert_eq!(default_name("busybox@sha256:abc"), "busybox");
    }
}

//! `ironlet ctr run|ps|logs|exec|rm`: containers from the command line, crictl/podman
//! style, on the same in-process runtime the agent uses.
//!
//! Each container made by `ctr run` gets a sandbox of its own in the `ironlet-ctr`
//! namespace; `ctr rm` removes the sandbox with its last container.

use super::output::{outln, stdout_error};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ironlet_runtime::local::logs::{open_log_for_reading, parse_record, LogStream};
use ironlet_runtime::types::{
    ContainerConfig, ContainerFilter, ContainerId, ContainerState, ContainerStatus, LinuxResources,
    PodSandboxConfig, SandboxId,
};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};
use tokio::io::AsyncWriteExt;

/// The sandbox namespace of containers made by `ctr run`.
const CTR_NAMESPACE: &str = "ironlet-ctr";

#[derive(Debug, Subcommand)]
pub enum CtrCommand {
    /// Run a container in the foreground; exits with the container's exit code.
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
    Logs { id: String },
    /// Run a command in a running container.
    Exec {
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
    /// Memory limit, e.g. 64m, 1g or bytes.
    #[arg(long, value_parser = parse_bytes)]
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
    /// Override the image's entrypoint.
    #[arg(long)]
    pub entrypoint: Option<String>,
    /// Environment variables, KEY=VALUE.
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

fn parse_bytes(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1i64),
        Some((i, _)) => {
            let mult = match s[i..].to_ascii_lowercase().as_str() {
                "b" => 1,
                "k" | "kb" | "ki" | "kib" => 1 << 10,
                "m" | "mb" | "mi" | "mib" => 1 << 20,
                "g" | "gb" | "gi" | "gib" => 1 << 30,
                other => return Err(format!("unknown unit {other:?} (use k, m or g)")),
            };
            (&s[..i], mult)
        }
    };
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64m)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s} is too large"))
}

pub fn run(root_flag: Option<PathBuf>, cmd: CtrCommand) -> anyhow::Result<ExitCode> {
    let rootless = super::running_rootless() || matches!(&cmd, CtrCommand::Run(a) if a.rootless);
    if rootless && !super::running_rootless() {
        bail!("--rootless runs containers as the invoking user; run it as an unprivileged user");
    }
    let root_dir = super::root_dir(&root_flag, rootless);
    // The zygote must exist before any thread: tokio starts below.
    let zygote = ironlet_runtime::zygote::spawn().context("starting the zygote")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let images = super::open_images(&root_dir)?;
        if rootless {
            warn_rootless_limits();
        }
        let config = LocalRuntimeConfig {
            root_dir: root_dir.clone(),
            rootless,
            default_cgroup_parent: (!rootless).then(|| "/ironlet".to_owned()),
            // One-off containers keep a loopback-only network namespace.
            cni: None,
        };
        let runtime = LocalRuntime::new(config, zygote, images)
            .await
            .with_context(|| format!("opening the runtime at {}", root_dir.display()))?;
        match cmd {
            CtrCommand::Run(args) => run_container(&runtime, args).await,
            CtrCommand::Ps { all, quiet } => ps(&runtime, all, quiet).await,
            CtrCommand::Logs { id } => logs(&runtime, &id).await,
            CtrCommand::Exec { id, command } => exec(&runtime, &id, command).await,
            CtrCommand::Rm { force, ids } => rm(&runtime, force, ids).await,
        }
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
             (--memory, --pids) are NOT enforced"
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

async fn run_container(runtime: &LocalRuntime, args: RunArgs) -> anyhow::Result<ExitCode> {
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
    let sandbox_config = PodSandboxConfig {
        pod_uid: pod_uid.clone(),
        name: name.clone(),
        namespace: CTR_NAMESPACE.to_owned(),
        hostname: name.clone(),
        host_network: args.net_host,
        log_directory: log_root.join(format!("{CTR_NAMESPACE}_{name}_{pod_uid}")),
        ..PodSandboxConfig::default()
    };
    let sandbox = runtime
        .run_pod_sandbox(&sandbox_config)
        .await
        .context("creating the sandbox")?;
    let env = args
        .env
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
            None => Err(anyhow::anyhow!("--env {kv:?} is not KEY=VALUE")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut config = ContainerConfig {
        name: name.clone(),
        image: args.image.clone(),
        command: args.entrypoint.iter().cloned().collect(),
        args: args.command.clone(),
        env,
        resources: LinuxResources {
            memory_limit_bytes: args.memory,
            pids_limit: args.pids,
            ..LinuxResources::default()
        },
        log_path: PathBuf::from(format!("{name}/0.log")),
        labels: BTreeMap::from([("io.kubernetes.container.name".to_owned(), name.clone())]),
        ..ContainerConfig::default()
    };
    config.security.read_only_rootfs = args.read_only;
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
    let mut output = runtime.tap_output(&id)?;
    runtime
        .start_container(&id)
        .await
        .context("starting the container")?;
    let copy = async {
        let mut stdout = tokio::io::stdout();
        let mut stderr = tokio::io::stderr();
        while let Some((stream, bytes)) = output.recv().await {
            let _ = match stream {
                LogStream::Stdout => stdout.write_all(&bytes).await,
                LogStream::Stderr => stderr.write_all(&bytes).await,
            };
        }
        let _ = stdout.flush().await;
        let _ = stderr.flush().await;
    };
    let status = tokio::select! {
        (_, status) = async { tokio::join!(copy, runtime.wait(&id)) } => status?,
        _ = tokio::signal::ctrl_c() => {
            runtime.stop_container(&id, Duration::from_secs(10)).await?;
            runtime.wait(&id).await?
        }
    };
    let code = status.exit_code.unwrap_or(1);
    if let Some(reason) = status.reason.filter(|r| r.as_str() == "OOMKilled") {
        eprintln!("ironlet: container {} was {}", id.short(), reason.as_str());
    }
    if args.rm {
        runtime.remove_container(&id).await?;
        remove_sandbox(runtime, &sandbox, log_dir).await?;
    } else {
        println_stderr_id(&id);
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
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

async fn logs(runtime: &LocalRuntime, id: &str) -> anyhow::Result<ExitCode> {
    let status = resolve(runtime, id).await?;
    let read = |path: &Path| -> std::io::Result<String> {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut open_log_for_reading(path)?, &mut text)?;
        Ok(text)
    };
    let text = match read(&status.log_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", status.log_path.display())),
    };
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    for line in text.lines() {
        let Some((stream, partial, content)) = parse_record(line) else {
            continue;
        };
        let mut bytes = content.as_bytes().to_vec();
        if !partial {
            bytes.push(b'\n');
        }
        if stream == "stderr" {
            stderr.write_all(&bytes).await?;
        } else {
            stdout.write_all(&bytes).await.map_err(stdout_error)?;
        }
    }
    stdout.flush().await.map_err(stdout_error)?;
    stderr.flush().await?;
    Ok(ExitCode::SUCCESS)
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

async fn rm(runtime: &LocalRuntime, force: bool, ids: Vec<String>) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for wanted in ids {
        let result = async {
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
                    remove_sandbox(runtime, &status.sandbox_id, &sandbox.config.log_directory)
                        .await?;
                }
            }
            outln!("{}", status.id)?;
            Ok(())
        }
        .await;
        if let Err(err) = result {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_like_docker() {
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12x").is_err());
        assert!(parse_bytes("m").is_err());
    }

    #[test]
    fn default_names_come_from_the_image() {
        assert_eq!(default_name("docker.io/library/busybox:1.36"), "busybox");
        assert_eq!(default_name("busybox@sha256:abc"), "busybox");
    }
}

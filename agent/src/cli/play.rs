//! `ironlet play FILE…`: run pod manifests in the foreground, as the invoking user (root or
//! rootless), with the node agent's own semantics — like `podman kube play`, but a pod that
//! works here works on a node, because it is the agent that runs it.
//!
//! Design: no mini-kubelet. `play` starts the real agent ([`ironlet::kubelet::Kubelet`]) in
//! process, on a private zygote (as `ctr run` does), with a data root of its own,
//! `<root-dir>/play/<id>` (`<id>`: a hash of the files' absolute paths, so `--down FILE…`
//! finds it). The given files are copied into `<state>/manifests`, which is the agent's
//! static pod path: the file pod source runs the pods and the file object source serves the
//! ConfigMaps and Secrets written beside them. Init and sidecar containers, probes, restart
//! policies, volumes, grace periods and preStop hooks are therefore the agent's. Images come
//! from the user's image store (`<root-dir>/images`, shared with `ironlet images` and
//! `ctr run`); image GC is off and node-pressure eviction watches memory only, so a laptop's
//! full disk neither deletes the user's images nor evicts the pods. Pod logs, sandboxes,
//! network namespaces and (as root) the cgroup tree `/ironlet-play-<id>` are the play's own.
//!
//! Behaviour:
//! * before anything runs, every document is decoded, defaulted and validated as the agent
//!   does (the agent's messages), and every ConfigMap or Secret a pod needs (not `optional`)
//!   must be in the files;
//! * every container's log lines (init containers and restarts included) are printed to
//!   stdout as they are written, prefixed `pod/container | ` (see [`logs`]);
//! * when every pod with `restartPolicy: Never` or `OnFailure` has completed (or every pod
//!   is finished), `play` stops the rest and exits with the exit code of the first failed
//!   container (0 if all succeeded); with `Always` pods only it runs until Ctrl-C/SIGTERM;
//! * stopping is the agent's: the manifests are removed, so each pod is killed with its grace
//!   period and preStop hooks, and housekeeping removes sandboxes, containers, volumes and
//!   logs; then the state directory and cgroup tree go. A second Ctrl-C kills what is left at
//!   once. Exit code after a signal: 130 (SIGINT) or 143 (SIGTERM);
//! * `-d` starts the same command again as a background agent (a new session, output to
//!   `<state>/play.log`, as `ctr run -d` does) and returns once its agent runs;
//!   `play --down FILE…` sends that agent SIGTERM and waits while it removes everything (if
//!   it is gone, `--down` removes what is left itself).

mod logs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use ironlet::config::{read_manifest, ManifestOrigin};
use ironlet::kubelet::{Kubelet, KubeletConfig};
use ironlet::objects::{pod_object_refs, FileObjectSource, ObjectKind, ObjectSource};
use ironlet_runtime::image::LocalImageService;
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};
use sha2::{Digest, Sha256};

use super::ctr::detach;

#[derive(Debug, Args)]
pub struct PlayArgs {
    /// Leave the pods running under a background agent and return; `--down` removes them.
    #[arg(short, long, conflicts_with = "down")]
    pub detach: bool,
    /// Stop and remove what a detached `play` of the same files left.
    #[arg(long)]
    pub down: bool,
    #[command(flatten)]
    pub network: super::run::PodNetworkArgs,
    /// Pod manifests (YAML or JSON, several documents each): Pods, and the ConfigMaps and
    /// Secrets they use.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// How long a detached agent is given to stop its pods on `--down` before it is killed.
const DOWN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often logs are read and the pods' states checked.
const TICK: Duration = Duration::from_millis(100);

pub fn run(root_flag: Option<PathBuf>, args: PlayArgs) -> anyhow::Result<ExitCode> {
    let rootless = super::running_rootless();
    let root = super::root_dir(&root_flag, rootless);
    let play = Play::new(&root, &args.files)?;
    if args.down {
        return down(&play, &args);
    }
    let node_name = node_name()?;
    let mut reporter = detach::Reporter::from_env();
    if args.detach && reporter.is_none() {
        // Validation errors are the caller's to print: check before going to the background.
        small_runtime()?.block_on(prepare(&play, &node_name))?;
        return detach::launch();
    }
    if reporter.is_some() {
        redirect_stderr(&play.state.join("play.log"));
    }
    let result = serve(&play, &args, rootless, node_name, reporter.as_mut());
    if let (Err(err), Some(reporter)) = (&result, reporter.as_mut()) {
        reporter.failed(err);
    }
    result
}

/// One play: the files and the state directory derived from them.
struct Play {
    /// The files, absolute, in the order given.
    files: Vec<PathBuf>,
    /// `<root-dir>/play/<id>`: the agent's data root.
    state: PathBuf,
    /// The user's data root (its image store is used).
    root: PathBuf,
    id: String,
}

/// A pod of the played files, as the agent names it.
#[derive(Debug, Clone)]
struct PlayPod {
    uid: String,
    /// The name written in the file (the agent's is `<name>-<node>`).
    name: String,
    restart_always: bool,
}

impl Play {
    fn new(root: &Path, files: &[PathBuf]) -> anyhow::Result<Self> {
        let files = files
            .iter()
            .map(|f| {
                f.canonicalize()
                    .or_else(|_| std::path::absolute(f))
                    .with_context(|| format!("resolving {}", f.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut hasher = Sha256::new();
        for file in &files {
            hasher.update(file.as_os_str().as_encoded_bytes());
            hasher.update([0]);
        }
        let id = hex::encode(&hasher.finalize()[..6]);
        Ok(Self {
            state: root.join("play").join(&id),
            root: root.to_owned(),
            files,
            id,
        })
    }

    fn manifests(&self) -> PathBuf {
        self.state.join("manifests")
    }

    /// The copy of the `index`th file in the manifest directory.
    fn copy_of(&self, index: usize) -> PathBuf {
        let base = self.files[index]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let base = base.trim_start_matches('.');
        self.manifests().join(format!("{index:03}-{base}"))
    }

    fn pid_file(&self) -> PathBuf {
        self.state.join("play.pid")
    }

    /// The cgroup tree of the play's pods (as root; rootless, below the delegated cgroup).
    fn cgroup_root(&self) -> String {
        format!("/ironlet-play-{}", self.id)
    }

    fn files_text(&self) -> String {
        let names: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        names.join(" ")
    }

    /// The pid of the agent playing these files, if it runs.
    fn agent_pid(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let ours = cmdline.split(|b| *b == 0).any(|arg| arg == b"play");
        (ours && pid != std::process::id() as i32).then_some(pid)
    }

    /// Reads the copied manifests as the agent will: decoded, defaulted, validated.
    async fn load(&self, node_name: &str) -> anyhow::Result<Vec<PlayPod>> {
        let mut pods = Vec::new();
        let mut errors = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (index, original) in self.files.iter().enumerate() {
            let copy = self.copy_of(index);
            let bytes =
                std::fs::read(&copy).with_context(|| format!("reading {}", copy.display()))?;
            // Messages name the user's file, not the copy.
            let rename = |text: String| {
                text.replace(&copy.display().to_string(), &original.display().to_string())
            };
            let read = match read_manifest(&bytes, &ManifestOrigin::File(copy.clone()), node_name) {
                Ok(read) => read,
                Err(err) => {
                    errors.push(rename(err.to_string()));
                    continue;
                }
            };
            errors.extend(read.invalid.iter().map(|e| rename(e.to_string())));
            for pod in read.pods {
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                let full = pod.metadata.name.clone().unwrap_or_default();
                let name = full
                    .strip_suffix(&format!("-{node_name}"))
                    .unwrap_or(&full)
                    .to_owned();
                if !names.insert((namespace.clone(), name.clone())) {
                    errors.push(format!("pod {namespace}/{name} is defined twice"));
                }
                let spec = pod.spec.clone().unwrap_or_default();
                pods.push((
                    PlayPod {
                        uid: pod.metadata.uid.clone().unwrap_or_default(),
                        name,
                        restart_always: spec.restart_policy.as_deref().unwrap_or("Always")
                            == "Always",
                    },
                    namespace,
                    spec,
                ));
            }
        }
        if !errors.is_empty() {
            bail!("{}", errors.join("\n"));
        }
        if pods.is_empty() {
            bail!("no pods in {}", self.files_text());
        }
        self.missing_objects_check(&pods).await?;
        Ok(pods.into_iter().map(|(pod, _, _)| pod).collect())
    }

    /// Every ConfigMap and Secret a pod needs must be in the files (kubelet would leave the
    /// pod waiting with `CreateContainerConfigError`; here the files are all there is).
    async fn missing_objects_check(
        &self,
        pods: &[(PlayPod, String, k8s_openapi::api::core::v1::PodSpec)],
    ) -> anyhow::Result<()> {
        let objects = FileObjectSource::new(self.manifests());
        let mut missing = Vec::new();
        {
            for (pod, namespace, spec) in pods {
                for reference in pod_object_refs(spec).into_iter().filter(|r| !r.optional) {
                    let found = match reference.kind {
                        ObjectKind::ConfigMap => objects
                            .config_map(namespace, &reference.name)
                            .await?
                            .is_some(),
                        ObjectKind::Secret => {
                            objects.secret(namespace, &reference.name).await?.is_some()
                        }
                    };
                    if !found {
                        missing.push(format!(
                            "pod {}: {} {:?} not found",
                            pod.name,
                            reference.kind.as_str(),
                            reference.name
                        ));
                    }
                }
            }
        }
        if !missing.is_empty() {
            bail!(
                "{} (a ConfigMap or Secret a pod uses must be in the played files, or the \
                 reference `optional: true`)",
                missing.join("; ")
            );
        }
        Ok(())
    }
}

fn small_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn node_name() -> anyhow::Result<String> {
    Ok(nix::unistd::gethostname()
        .context("reading the host name")?
        .to_string_lossy()
        .to_lowercase())
}

/// Creates the state directory with the copies of the files and checks them; on an error
/// nothing is left.
async fn prepare(play: &Play, node_name: &str) -> anyhow::Result<Vec<PlayPod>> {
    if play.state.exists() {
        let files = play.files_text();
        if let Some(pid) = play.agent_pid() {
            bail!(
                "{files} already playing (pid {pid}); stop it with `ironlet play --down {files}`"
            );
        }
        bail!(
            "{files} played before and not cleaned up ({}); remove it with `ironlet play --down {files}`",
            play.state.display()
        );
    }
    let mut contents = Vec::new();
    for file in &play.files {
        contents.push(std::fs::read(file).with_context(|| format!("reading {}", file.display()))?);
    }
    let result = async {
        for dir in [play.root.join("play"), play.state.clone(), play.manifests()] {
            ironlet_runtime::fsutil::private_dir(&dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        for (index, bytes) in contents.iter().enumerate() {
            let copy = play.copy_of(index);
            std::fs::write(&copy, bytes).with_context(|| format!("writing {}", copy.display()))?;
        }
        play.load(node_name).await
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&play.state);
    }
    result
}

/// Points stderr (the detached agent's logging) at `path`.
fn redirect_stderr(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // SAFETY: dup2 onto fd 2 replaces /dev/null; `file` stays open until then.
        unsafe { libc::dup2(file.as_raw_fd(), 2) };
    }
}

/// How the play ended.
enum Outcome {
    /// Every pod that completes did: the exit code of the first failed container.
    Completed(u8),
    /// SIGINT or SIGTERM.
    Signalled(i32),
}

/// The agent: runs the pods and removes them (foreground, or the detached agent).
fn serve(
    play: &Play,
    args: &PlayArgs,
    rootless: bool,
    node_name: String,
    reporter: Option<&mut detach::Reporter>,
) -> anyhow::Result<ExitCode> {
    // Everything the play writes about its pods goes when it ends (`--down` removes what a
    // crash left): no fsyncs (the zygote forked below inherits this).
    ironlet_runtime::fsutil::set_state_throwaway();
    // The zygote must exist before any thread.
    let zygote = ironlet_runtime::zygote::spawn().context("starting the zygote")?;
    let rt = super::agent_runtime()?;
    // Outer error: before the state directory is ours (nothing to remove); inner: after.
    let session = rt.block_on(async move {
        // From here on a Ctrl-C stops the play the orderly way, whenever it comes.
        let mut signals = Signals::new()?;
        let pods = match &reporter {
            None => prepare(play, &node_name).await?,
            Some(_) => play.load(&node_name).await?,
        };
        let Started {
            kubelet,
            runtime,
            pod_logs,
            socket,
        } = match start_agent(play, args, rootless, zygote, &node_name).await {
            Ok(started) => started,
            Err(err) => return Ok(Err(err)),
        };
        let statuses = kubelet.statuses();
        let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
        let (view, metrics) = (kubelet.view(), kubelet.metrics());
        let serving = tokio::spawn(async move {
            ironlet::server::serve(&socket, view, metrics, server_stopped).await
        });
        let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
        let agent = kubelet.run(async move {
            let _ = agent_stopped.await;
        });
        // The sync loop and this driver share the task: the loop runs while the driver waits.
        let driver = async {
            let running = Running {
                pods: &pods,
                statuses: &statuses,
                runtime: &*runtime,
                node_name: &node_name,
                pod_logs,
            };
            let result = drive(play, running, &mut signals, reporter).await;
            let _ = stop_agent.send(());
            result
        };
        let ((), driven) = tokio::join!(agent, driver);
        let _ = stop_server.send(());
        let _ = serving.await;
        // Whatever the agent did not remove (a forced stop, a failure) goes now.
        remove_runtime_pods(&*runtime).await;
        anyhow::Ok(driven)
    });
    // The agent's tasks (the file source's watch among them) end before its files go.
    drop(rt);
    let driven = session?;
    remove_leftovers(play)?;
    Ok(match driven? {
        Outcome::Completed(code) => ExitCode::from(code),
        Outcome::Signalled(signal) => ExitCode::from((128 + signal).clamp(0, 255) as u8),
    })
}

/// The agent of a play, started.
struct Started {
    kubelet: Kubelet,
    runtime: Arc<dyn Runtime>,
    pod_logs: PathBuf,
    socket: PathBuf,
}

/// What the driver watches while the agent runs.
struct Running<'a> {
    pods: &'a [PlayPod],
    statuses: &'a ironlet::kubelet::status_store::StatusStore,
    runtime: &'a dyn Runtime,
    node_name: &'a str,
    pod_logs: PathBuf,
}

/// Opens the runtime on the state directory and starts the agent on it.
async fn start_agent(
    play: &Play,
    args: &PlayArgs,
    rootless: bool,
    zygote: ironlet_runtime::zygote::ZygoteHandle,
    node_name: &str,
) -> anyhow::Result<Started> {
    std::fs::write(play.pid_file(), std::process::id().to_string())
        .context("writing the pid file")?;
    let store = super::open_images(&play.root)?;
    let runtime = open_runtime(play, args, rootless, zygote, store.clone()).await?;
    let runtime: Arc<dyn Runtime> = Arc::new(runtime);
    let pull = super::pull_config(
        &play.root,
        None,
        3,
        &super::CredentialProviderArgs::default(),
    )?;
    let images = Arc::new(LocalImageService::with_pull_config(store, pull));
    let config = kubelet_config(play, node_name.to_owned())?;
    let pod_logs = config.pod_log_dir.clone();
    let socket = config.socket_path();
    let kubelet = Kubelet::start(config, runtime.clone(), images)
        .await
        .context("starting the node agent")?;
    Ok(Started {
        kubelet,
        runtime,
        pod_logs,
        socket,
    })
}

/// Reports to the `-d` caller, streams logs (foreground), waits for completion or a signal,
/// then stops the pods.
async fn drive(
    play: &Play,
    running: Running<'_>,
    signals: &mut Signals,
    reporter: Option<&mut detach::Reporter>,
) -> anyhow::Result<Outcome> {
    let Running {
        pods,
        statuses,
        runtime,
        node_name,
        pod_logs,
    } = running;
    let foreground = reporter.is_none();
    if let Some(reporter) = reporter {
        let names: Vec<String> = pods.iter().map(|p| format!("pod/{}", p.name)).collect();
        reporter.ready(&names.join(" "));
    }
    let mut streamer = foreground.then(|| logs::Streamer::new(pod_logs, node_name));
    let mut tick = tokio::time::interval(TICK);
    let outcome = loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(streamer) = streamer.as_mut() {
                    streamer.poll();
                }
                // A detached play keeps its finished pods until `--down`.
                if !foreground {
                    continue;
                }
                if let Some(code) = completion(statuses, pods) {
                    break Outcome::Completed(code);
                }
            }
            signal = signals.recv() => break Outcome::Signalled(signal),
        }
    };
    if foreground && matches!(outcome, Outcome::Signalled(_)) {
        eprintln!("ironlet play: stopping the pods (Ctrl-C again to kill them at once)");
    }
    stop_pods(play, statuses, runtime, signals, streamer.as_mut()).await?;
    Ok(outcome)
}

/// The play's runtime on its state directory; pod networking as `ironlet run` has it: the
/// node's CNI network as root, pasta rootless (the runtime ignores the CNI settings then,
/// but needs them present: `None` means loopback only).
async fn open_runtime(
    play: &Play,
    args: &PlayArgs,
    rootless: bool,
    zygote: ironlet_runtime::zygote::ZygoteHandle,
    store: Arc<ironlet_runtime::image::ImageStore>,
) -> anyhow::Result<LocalRuntime> {
    let cni = args.network.cni("10.85.0.0/16");
    let config = LocalRuntimeConfig {
        root_dir: play.state.clone(),
        rootless,
        default_cgroup_parent: None,
        cni,
        log_rotation: Default::default(),
    };
    let runtime = LocalRuntime::new(config, zygote, store)
        .await
        .with_context(|| format!("opening the runtime at {}", play.state.display()))?;
    // pasta connects a rootless pod's network while its first container is created.
    runtime.network_ready_at_start();
    Ok(runtime)
}

/// The agent's settings for a play.
fn kubelet_config(play: &Play, node_name: String) -> anyhow::Result<KubeletConfig> {
    use ironlet::kubelet::eviction::thresholds::{EvictionSettings, SignalMap, ThresholdMap};
    let mut config = KubeletConfig::new(node_name, play.state.clone());
    config.pod_log_dir = play.state.join("logs");
    config.manifest_path = Some(play.manifests());
    config.cgroup_root = format!("{}/kubepods", play.cgroup_root());
    // Housekeeping removes finished pods: a stop takes one period, not kubelet's 2 s.
    config.housekeeping_period = Duration::from_millis(500);
    // The user's image store is not the play's to collect.
    config.image_gc_policy.high_threshold_percent = 100;
    let memory_only =
        ThresholdMap::parse_flag("memory.available<100Mi").map_err(anyhow::Error::msg)?;
    let none = SignalMap::default();
    config.eviction = EvictionSettings::build(
        &memory_only,
        &ThresholdMap::default(),
        &none,
        &none,
        0,
        Duration::from_secs(300),
    )
    .context("eviction thresholds")?;
    Ok(config)
}

/// `Some(exit code)` once the play is over: every pod that completes (restartPolicy
/// `Never`/`OnFailure`) has, or every pod is finished.
fn completion(
    statuses: &ironlet::kubelet::status_store::StatusStore,
    pods: &[PlayPod],
) -> Option<u8> {
    let mut all_finished = true;
    let mut completing = 0;
    let mut completed = 0;
    let mut failure = None;
    for pod in pods {
        let status = statuses.status(&pod.uid);
        let phase = status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        let finished = matches!(phase, "Succeeded" | "Failed");
        all_finished &= finished;
        if !pod.restart_always {
            completing += 1;
            completed += usize::from(finished);
        }
        if phase == "Failed" && failure.is_none() {
            failure = Some(status.as_ref().map_or(1, failed_exit_code));
        }
    }
    (all_finished || (completing > 0 && completed == completing)).then(|| failure.unwrap_or(0))
}

/// The exit code of a failed pod's first container that exited non-zero (1 without one:
/// rejected, deadline exceeded, …).
fn failed_exit_code(status: &k8s_openapi::api::core::v1::PodStatus) -> u8 {
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .map(|t| t.exit_code)
        .find(|code| *code != 0)
        .map_or(1, |code| code.clamp(1, 255) as u8)
}

/// SIGINT and SIGTERM.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }
}

/// Removes the manifests, so the agent kills every pod (grace periods, preStop hooks) and
/// its housekeeping removes them; waits until no pod and no sandbox is left. A signal
/// meanwhile kills every container at once.
async fn stop_pods(
    play: &Play,
    statuses: &ironlet::kubelet::status_store::StatusStore,
    runtime: &dyn Runtime,
    signals: &mut Signals,
    mut streamer: Option<&mut logs::Streamer>,
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(play.manifests()).context("listing the manifests")? {
        let path = entry.context("listing the manifests")?.path();
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    let mut tick = tokio::time::interval(TICK);
    let mut forced: Option<Instant> = None;
    let mut empty_ticks = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.recv(), if forced.is_none() => {
                eprintln!("ironlet play: killing the pods");
                forced = Some(Instant::now());
                kill_containers(runtime).await;
            }
        }
        if let Some(streamer) = streamer.as_mut() {
            streamer.poll();
        }
        let sandboxes = runtime
            .list_pod_sandboxes()
            .await
            .map(|s| s.len())
            .unwrap_or(1);
        let gone = statuses.pods().is_empty() && sandboxes == 0;
        empty_ticks = if gone { empty_ticks + 1 } else { 0 };
        // For half a second: the file source's removal is seen, nothing is being created.
        if empty_ticks >= 5 {
            return Ok(());
        }
        if forced.is_some_and(|at| at.elapsed() > Duration::from_secs(10)) {
            // The agent did not finish; the caller removes the rest from the runtime.
            return Ok(());
        }
    }
}

/// SIGKILLs every container of the play's runtime.
async fn kill_containers(runtime: &dyn Runtime) {
    let all = ironlet_runtime::types::ContainerFilter::default();
    for container in runtime.list_containers(&all).await.unwrap_or_default() {
        if let Err(err) = runtime.stop_container(&container.id, Duration::ZERO).await {
            tracing::warn!(container_id = %container.id, %err, "killing a container failed");
        }
    }
}

/// Removes every container and sandbox left in the play's runtime.
async fn remove_runtime_pods(runtime: &dyn Runtime) {
    kill_containers(runtime).await;
    let all = ironlet_runtime::types::ContainerFilter::default();
    for container in runtime.list_containers(&all).await.unwrap_or_default() {
        if let Err(err) = runtime.remove_container(&container.id).await {
            tracing::warn!(container_id = %container.id, %err, "removing a container failed");
        }
    }
    for sandbox in runtime.list_pod_sandboxes().await.unwrap_or_default() {
        if let Err(err) = runtime.remove_pod_sandbox(&sandbox.id).await {
            tracing::warn!(sandbox_id = %sandbox.id, %err, "removing a sandbox failed");
        }
    }
}

/// After the runtime: mounts under the state directory (volumes of a pod the agent did not
/// tear down), the cgroup tree, the state directory.
fn remove_leftovers(play: &Play) -> anyhow::Result<()> {
    let prefix = format!("{}/", play.state.display());
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    mounts.sort();
    for mount in mounts.iter().rev() {
        if let Err(err) = nix::mount::umount2(mount.as_str(), nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount, %err, "unmounting a leftover failed");
        }
    }
    if let Ok(hierarchy) = ironlet_cgroups::Hierarchy::detect() {
        // Rootless, the tree lies in the delegated cgroup v2 subtree, if there is one.
        let base = if super::running_rootless() {
            match ironlet_cgroups::Delegation::prepare(&hierarchy) {
                ironlet_cgroups::Delegation::Full { root } => Some(root),
                ironlet_cgroups::Delegation::None { .. } => None,
            }
        } else {
            Some(ironlet_cgroups::CgroupPath::root())
        };
        let path = base.map(|base| {
            let base = base.as_str().trim_end_matches('/').to_owned();
            ironlet_cgroups::CgroupPath::new(&format!("{base}{}", play.cgroup_root()))
        });
        if let Some(Ok(path)) = path {
            if let Err(err) = hierarchy.remove(&path) {
                tracing::warn!(cgroup = %path, %err, "removing the play's cgroup tree failed");
            }
        }
    }
    match std::fs::remove_dir_all(&play.state) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("removing {}", play.state.display())),
    }
}

/// `play --down FILE…`: stops the detached agent (which removes its pods) and removes what
/// is left.
fn down(play: &Play, args: &PlayArgs) -> anyhow::Result<ExitCode> {
    if !play.state.exists() {
        bail!(
            "{} is not playing (no {})",
            play.files_text(),
            play.state.display()
        );
    }
    if let Some(pid) = play.agent_pid() {
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .context("stopping the play's agent")?;
        let started = Instant::now();
        // The agent is not our child: its /proc entry tells when it has gone.
        while Path::new(&format!("/proc/{pid}")).exists() {
            if started.elapsed() > DOWN_TIMEOUT {
                eprintln!("ironlet play: the agent did not stop in {DOWN_TIMEOUT:?}; killing it");
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(500));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if play.state.exists() {
        // No agent (killed, crashed): remove its runtime's pods from here.
        let zygote = ironlet_runtime::zygote::spawn().context("starting the zygote")?;
        small_runtime()?.block_on(async {
            let store = super::open_images(&play.root)?;
            let runtime =
                open_runtime(play, args, super::running_rootless(), zygote, store).await?;
            remove_runtime_pods(&runtime).await;
            anyhow::Ok(())
        })?;
        remove_leftovers(play)?;
    }
    Ok(ExitCode::SUCCESS)
}

//! `ironlet run`: the node agent. Flags are kubelet's where kubelet has one
//! (`--pod-manifest-path`, `--node-name`/`--hostname-override`, `--root-dir`,
//! `--sync-frequency`, `--max-pods`, `--system-reserved`, …).
//!
//! Process structure (see `ironlet_runtime::supervisor` and docs/CRASH_SAFETY.md):
//! `ironlet run` starts as the supervisor — single-threaded, no tokio, the zygote loop and
//! child subreaper — which forks and execs the same binary with the same arguments as the
//! agent, passing its end of a socket pair in `IRONLET_SUPERVISOR_FD`. The agent process
//! takes that connection first thing, before tokio starts any thread, and re-adopts the
//! containers the supervisor kept while it was down.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ironlet::kubelet::eviction::thresholds::{EvictionSettings, Signal, SignalMap, ThresholdMap};
use ironlet::kubelet::{AbortOnDrop, Kubelet, KubeletConfig};
use ironlet_runtime::image::LocalImageService;
use ironlet_runtime::network::{CniConfig, DefaultNetwork};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON); flags
    /// given on the command line take precedence over it.
    #[arg(long = "config")]
    pub config: Option<PathBuf>,
    /// Fail the start when --config sets fields ironlet does not support (default: a
    /// warning naming them).
    #[arg(long = "fail-on-unsupported-config")]
    pub fail_on_unsupported_config: bool,
    /// Directory (or file) of static pod manifests (kubelet's --pod-manifest-path).
    #[arg(long = "pod-manifest-path", visible_alias = "manifests")]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of a pod manifest (or list) polled for static pods.
    #[arg(long = "manifest-url")]
    pub manifest_url: Option<String>,
    /// Kubeconfig of the cluster to join (node credentials). Without it, ironlet runs
    /// static pods only.
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// The node's name; default: the host name.
    #[arg(long = "node-name", visible_alias = "hostname-override")]
    pub node_name: Option<String>,
    /// Where pod logs go (KubeletConfiguration podLogsDir). Default: /var/log/pods as
    /// root, <root-dir>/logs rootless.
    #[arg(long = "pod-logs-dir")]
    pub pod_logs_dir: Option<PathBuf>,
    /// Max period between pod syncs (e.g. 1m, 30s).
    #[arg(long = "sync-frequency", value_parser = parse_duration, default_value = "1m")]
    pub sync_frequency: Duration,
    /// Full re-read period of the manifest path (inotify makes changes immediate).
    #[arg(long = "file-check-frequency", value_parser = parse_duration, default_value = "20s")]
    pub file_check_frequency: Duration,
    /// Poll period of --manifest-url.
    #[arg(long = "http-check-frequency", value_parser = parse_duration, default_value = "20s")]
    pub http_check_frequency: Duration,
    /// Period of the PLEG's safety relist (events are the primary path).
    #[arg(long = "pleg-relist-period", value_parser = parse_duration, default_value = "60s")]
    pub pleg_relist_period: Duration,
    /// Maximum number of pods on this node.
    #[arg(long = "max-pods", default_value_t = 110)]
    pub max_pods: u64,
    /// Resources reserved for the system, e.g. cpu=500m,memory=1Gi.
    #[arg(long = "system-reserved", value_parser = parse_reserved)]
    pub system_reserved: Option<Reserved>,
    /// Resources reserved for Kubernetes daemons, e.g. cpu=100m,memory=256Mi.
    #[arg(long = "kube-reserved", value_parser = parse_reserved)]
    pub kube_reserved: Option<Reserved>,
    /// Parent cgroup of the pods' tree (`<cgroup-root>/kubepods`).
    #[arg(long = "cgroup-root", default_value = "/")]
    pub cgroup_root: String,
    /// Remount cgroup2 with `favordynmods` (Linux >= 6.0), so that moving a container's
    /// process into its cgroups does not wait for an RCU grace period (10-20 ms per
    /// container on cgroup v1). Global and kept until reboot; `=false` leaves mounts alone.
    #[arg(
        long = "cgroup-favor-dynmods",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub cgroup_favor_dynmods: bool,
    /// Cap of the crash-loop back-off (KubeletConfiguration
    /// crashLoopBackOff.maxContainerRestartPeriod); at least 1s.
    #[arg(long = "max-container-restart-period", value_parser = parse_duration, default_value = "300s")]
    pub max_container_restart_period: Duration,
    /// Dead instances kept per (pod, container name) by container garbage collection;
    /// negative: no limit. The newest dead instance (what `kubectl logs --previous` reads)
    /// of a pod still wanted is always kept.
    #[arg(
        long = "maximum-dead-containers-per-container",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub maximum_dead_containers_per_container: i64,
    /// Dead containers kept on the node in all; negative: no limit.
    #[arg(long = "maximum-dead-containers", default_value_t = -1, allow_negative_numbers = true)]
    pub maximum_dead_containers: i64,
    /// Minimum age (since creation) of a dead container before it may be garbage collected.
    #[arg(long = "minimum-container-ttl-duration", value_parser = parse_duration, default_value = "0s")]
    pub minimum_container_ttl_duration: Duration,
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`
    /// (signals: memory.available, nodefs.available, nodefs.inodesFree, imagefs.available,
    /// imagefs.inodesFree, pid.available); a met threshold evicts at once.
    #[arg(long = "eviction-hard", value_parser = ThresholdMap::parse_flag,
          default_value = ironlet::kubelet::eviction::thresholds::DEFAULT_EVICTION_HARD)]
    pub eviction_hard: ThresholdMap,
    /// Soft eviction thresholds (same form); each needs --eviction-soft-grace-period.
    #[arg(long = "eviction-soft", value_parser = ThresholdMap::parse_flag, default_value = "")]
    pub eviction_soft: ThresholdMap,
    /// How long each soft threshold must be met before pods are evicted, e.g.
    /// `memory.available=1m30s`.
    #[arg(long = "eviction-soft-grace-period", value_parser = SignalMap::parse_flag, default_value = "")]
    pub eviction_soft_grace_period: SignalMap,
    /// Longest grace period (seconds) given to pods evicted for a soft threshold.
    #[arg(
        long = "eviction-max-pod-grace-period",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub eviction_max_pod_grace_period: i64,
    /// How far beyond a threshold a signal must recover once it was met, e.g.
    /// `memory.available=0Mi,nodefs.available=500Mi`.
    #[arg(long = "eviction-minimum-reclaim", value_parser = SignalMap::parse_flag, default_value = "")]
    pub eviction_minimum_reclaim: SignalMap,
    /// How long a pressure condition stays True after its thresholds stopped being met.
    #[arg(long = "eviction-pressure-transition-period", value_parser = parse_duration, default_value = "5m")]
    pub eviction_pressure_transition_period: Duration,
    #[command(flatten)]
    pub network: PodNetworkArgs,
    /// Pod addresses of the default bridge network (written only when --cni-conf-dir has
    /// no configuration).
    #[arg(long = "pod-cidr", default_value = "10.85.0.0/16")]
    pub pod_cidr: String,
    /// IP addresses of the cluster DNS servers for ClusterFirst pods (repeatable or
    /// comma-separated). Without any, ClusterFirst pods fall back to Default.
    #[arg(long = "cluster-dns", value_delimiter = ',')]
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain: pods search `<ns>.svc.<domain> svc.<domain> <domain>`.
    #[arg(long = "cluster-domain", default_value = "")]
    pub cluster_domain: String,
    /// The resolver file Default pods get (and whose search domains ClusterFirst pods
    /// add); empty: none.
    #[arg(long = "resolv-conf", default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Unsafe sysctls (or patterns ending in `*`) pods may set besides the safe ones,
    /// comma-separated, e.g. `kernel.msg*,net.core.somaxconn`; each must be namespaced.
    #[arg(long = "allowed-unsafe-sysctls", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Use the RuntimeDefault seccomp profile for containers that name none.
    #[arg(long = "seccomp-default")]
    pub seccomp_default: bool,
    /// The kubelet API's address (HTTPS; served with --kubeconfig, which authorizes its
    /// requests).
    #[arg(long = "address", default_value = "0.0.0.0")]
    pub address: std::net::IpAddr,
    /// The kubelet API's port; 0 picks a free one (the Node reports the real one).
    #[arg(long = "port", default_value_t = ironlet::server::kubelet_api::DEFAULT_PORT)]
    pub port: u16,
    /// kubelet's unauthenticated read-only port; only 0 (off, kubelet's default) is accepted.
    #[arg(long = "read-only-port", default_value_t = 0)]
    pub read_only_port: u16,
    /// A port-forward session without traffic for this long is closed (kubelet's default).
    #[arg(long = "streaming-connection-idle-timeout", value_parser = parse_duration, default_value = "4h")]
    pub streaming_connection_idle_timeout: Duration,
    /// Plain-HTTP /healthz port; 0 turns it off.
    #[arg(long = "healthz-port", default_value_t = ironlet::server::kubelet_api::DEFAULT_HEALTHZ_PORT)]
    pub healthz_port: u16,
    /// Address of the /healthz server.
    #[arg(long = "healthz-bind-address", default_value = "127.0.0.1")]
    pub healthz_bind_address: std::net::IpAddr,
    /// Serving certificate (PEM, chain allowed); default: a self-signed one in <root-dir>/pki.
    #[arg(long = "tls-cert-file", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of --tls-cert-file (PEM).
    #[arg(long = "tls-private-key-file", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Request the kubelet API's serving certificate from the cluster (a
    /// kubernetes.io/kubelet-serving CertificateSigningRequest) and renew it at 70–90 % of its
    /// lifetime; the file or self-signed certificate is served until the first is signed.
    #[arg(long = "rotate-server-certificates")]
    pub rotate_server_certificates: bool,
    /// CA bundle that client certificates of the kubelet API are verified against.
    #[arg(long = "client-ca-file")]
    pub client_ca_file: Option<PathBuf>,
    /// The node's InternalIP; default: the source address of the default route.
    #[arg(long = "node-ip")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Delay before the supervisor restarts a crashed agent; it doubles with every crash up
    /// to --agent-restart-backoff-max and is reset once an agent has run for 60 s.
    #[arg(long = "agent-restart-backoff", value_parser = parse_duration, default_value = "100ms")]
    pub agent_restart_backoff: Duration,
    /// Longest delay before the supervisor restarts a crashed agent.
    #[arg(long = "agent-restart-backoff-max", value_parser = parse_duration, default_value = "10s")]
    pub agent_restart_backoff_max: Duration,
    /// Registry mirrors, rewrites, TLS and credentials, in k3s' registries.yaml schema; or a
    /// directory of containerd hosts.toml files (DIR/<registry>/hosts.toml).
    #[arg(long = "registry-config")]
    pub registry_config: Option<PathBuf>,
    #[command(flatten)]
    pub credential_providers: super::CredentialProviderArgs,
    /// Layers of one image downloaded (and unpacked) at once; containerd's default is 3.
    #[arg(long = "max-concurrent-downloads", default_value_t = 3)]
    pub max_concurrent_downloads: usize,
    /// Image file system usage (percent) at or above which image garbage collection runs;
    /// 100 turns it off (unless --image-maximum-gc-age is set).
    #[arg(long = "image-gc-high-threshold", default_value_t = 85, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_high_threshold: u8,
    /// Image file system usage (percent) image garbage collection brings it down to; must
    /// be less than --image-gc-high-threshold.
    #[arg(long = "image-gc-low-threshold", default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
    /// Minimum age (since first seen) of an unused image before garbage collection may
    /// remove it.
    #[arg(long = "image-minimum-gc-age", value_parser = parse_duration, default_value = "2m")]
    pub image_minimum_gc_age: Duration,
    /// An image unused for longer is removed whatever the disk usage; 0s: off.
    #[arg(long = "image-maximum-gc-age", value_parser = parse_duration, default_value = "0s")]
    pub image_maximum_gc_age: Duration,
    /// Images image garbage collection never removes (as if `ironlet images pin`ned),
    /// comma-separated or repeated; containerd's `pinned_images`.
    #[arg(long = "pinned-images", value_delimiter = ',')]
    pub pinned_images: Vec<String>,
    /// How often image garbage collection runs (kubelet: 5m, not configurable; for tests).
    #[arg(long = "image-gc-period", value_parser = parse_duration, default_value = "5m", hide = true)]
    pub image_gc_period: Duration,
    /// Images listed in the Node's status.images (largest first); -1: no limit.
    #[arg(
        long = "node-status-max-images",
        default_value_t = 50,
        allow_negative_numbers = true
    )]
    pub node_status_max_images: i32,
    /// Pull one image at a time node-wide. ironlet's default is false (kubelet's is true,
    /// kept for old Docker daemons that broke under parallel pulls): ironlet joins
    /// concurrent pulls of one image, bounds the layers of each pull
    /// (--max-concurrent-downloads) and unpacks while downloading, so a serial queue would
    /// only make every pod wait behind the largest pull in front of it.
    #[arg(
        long = "serialize-image-pulls",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub serialize_image_pulls: bool,
    /// Most image pulls at once node-wide (needs --serialize-image-pulls=false); unset: no
    /// limit.
    #[arg(long = "max-parallel-image-pulls")]
    pub max_parallel_image_pulls: Option<i32>,
    /// Size (a quantity, e.g. `10Mi`) from which a container's log file is rotated.
    #[arg(long = "container-log-max-size", value_parser = parse_log_max_size, default_value = "10Mi")]
    pub container_log_max_size: u64,
    /// Log files kept per container instance, the current one included (at least 2).
    #[arg(long = "container-log-max-files", value_parser = parse_log_max_files, default_value_t = 5)]
    pub container_log_max_files: usize,
    /// Graceful node shutdown: how long the node's shutdown is delayed to stop the pods
    /// (regular pods first, then critical ones); 0s: off. Shutdowns are seen through logind
    /// where systemd runs, and as SIGPWR to the supervisor everywhere.
    #[arg(long = "shutdown-grace-period", value_parser = parse_duration, default_value = "0s")]
    pub shutdown_grace_period: Duration,
    /// The part of --shutdown-grace-period reserved for critical pods (priority of at least
    /// system-cluster-critical, 2000000000), stopped after the others.
    #[arg(long = "shutdown-grace-period-critical-pods", value_parser = parse_duration, default_value = "0s")]
    pub shutdown_grace_period_critical_pods: Duration,
    /// KubeletConfiguration `shutdownGracePeriodByPodPriority` (no flag, as in kubelet).
    #[arg(skip)]
    pub shutdown_grace_period_by_pod_priority: Vec<ironlet::kubelet::node_shutdown::PriorityGrace>,
}

/// The graceful node shutdown settings the flags ask for, validated as kubelet does.
pub(super) fn shutdown_settings(
    args: &RunArgs,
) -> anyhow::Result<ironlet::kubelet::node_shutdown::ShutdownSettings> {
    let settings = ironlet::kubelet::node_shutdown::ShutdownSettings {
        grace_period: args.shutdown_grace_period,
        grace_period_critical_pods: args.shutdown_grace_period_critical_pods,
        by_priority: args.shutdown_grace_period_by_pod_priority.clone(),
    };
    settings.validate().map_err(anyhow::Error::msg)?;
    Ok(settings)
}

/// `--container-log-max-size`: a quantity of bytes, more than 0.
pub(super) fn parse_log_max_size(text: &str) -> Result<u64, String> {
    let q = ironlet::qos::Quantity::parse(text).map_err(|e| e.to_string())?;
    match q.amount().map_err(|e| e.to_string())? {
        0 => Err("must be more than 0".into()),
        n => Ok(n),
    }
}

/// `--container-log-max-files`: kubelet requires at least 2.
pub(super) fn parse_log_max_files(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err(format!("{text:?}: must be a number of at least 2")),
    }
}

/// The image GC policy and pull limit the flags ask for, validated as kubelet validates them.
struct ImageSettings {
    gc_policy: ironlet::kubelet::image_gc::ImageGcPolicy,
    max_parallel_pulls: Option<usize>,
}

fn image_settings(args: &RunArgs) -> anyhow::Result<ImageSettings> {
    let gc_policy = ironlet::kubelet::image_gc::ImageGcPolicy {
        high_threshold_percent: args.image_gc_high_threshold,
        low_threshold_percent: args.image_gc_low_threshold,
        min_age: args.image_minimum_gc_age,
        max_age: args.image_maximum_gc_age,
    };
    gc_policy.validate().map_err(anyhow::Error::msg)?;
    if args.image_gc_period.is_zero() {
        bail!("--image-gc-period must be more than 0s");
    }
    let max_parallel_pulls = pull_limit(args.serialize_image_pulls, args.max_parallel_image_pulls)
        .map_err(anyhow::Error::msg)?;
    Ok(ImageSettings {
        gc_policy,
        max_parallel_pulls,
    })
}

/// Pulls at once node-wide from kubelet's `serializeImagePulls` and `maxParallelImagePulls`,
/// with kubelet's validation messages.
pub(super) fn pull_limit(
    serialize: bool,
    max_parallel: Option<i32>,
) -> Result<Option<usize>, String> {
    match (serialize, max_parallel) {
        (_, Some(n)) if n < 1 => Err(format!(
            "invalid configuration: maxParallelImagePulls (--max-parallel-image-pulls) {n} must be a positive number"
        )),
        (true, Some(n)) if n > 1 => Err(format!(
            "invalid configuration: maxParallelImagePulls (--max-parallel-image-pulls) {n} must be 1 or nil when serializeImagePulls (--serialize-image-pulls) is true"
        )),
        (true, _) => Ok(Some(1)),
        (false, n) => Ok(n.and_then(|n| usize::try_from(n).ok())),
    }
}

/// CPU and memory set aside from allocatable.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reserved {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
}

pub(super) fn parse_reserved(text: &str) -> Result<Reserved, String> {
    let mut out = Reserved::default();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not NAME=QUANTITY"))?;
        let q = ironlet::qos::Quantity::parse(value).map_err(|e| format!("{key}: {e}"))?;
        match key {
            "cpu" => out.cpu_milli = q.milli_amount().map_err(|e| format!("cpu: {e}"))?,
            "memory" => out.memory_bytes = q.amount().map_err(|e| format!("memory: {e}"))?,
            "ephemeral-storage" | "pid" => {}
            other => return Err(format!("unknown resource {other:?} (cpu, memory)")),
        }
    }
    Ok(out)
}

pub use ironlet::kubelet::config::parse_duration;

pub fn run(
    root_flag: Option<PathBuf>,
    mut args: RunArgs,
    matches: &clap::ArgMatches,
) -> anyhow::Result<ExitCode> {
    super::kubelet_config::apply_file(&mut args, matches)?;
    // A configuration error stops the start here, not in an agent the supervisor restarts.
    image_settings(&args)?;
    args.credential_providers.load()?;
    LocalImageService::check_pinned_images(&args.pinned_images).context("--pinned-images")?;
    shutdown_settings(&args)?;
    let rootless = super::running_rootless();
    let root_dir = super::root_dir(&root_flag, rootless);
    if args.pod_manifest_path.is_none() && args.manifest_url.is_none() && args.kubeconfig.is_none()
    {
        bail!("no pod source: give --kubeconfig FILE or --pod-manifest-path DIR (or --manifest-url URL)");
    }
    // Before any thread: either we are the agent a supervisor started, or we become the
    // supervisor (which starts us again as the agent).
    match ironlet_runtime::supervisor::agent_connection().context("connecting to the supervisor")? {
        Some(zygote) => run_agent(root_dir, rootless, args, zygote),
        None => supervise(root_dir, &args),
    }
}

/// Becomes the supervisor; returns only if that failed.
fn supervise(root_dir: PathBuf, args: &RunArgs) -> anyhow::Result<ExitCode> {
    ironlet_runtime::fsutil::private_dir(&root_dir)
        .with_context(|| format!("creating the data root {}", root_dir.display()))?;
    let mut config = ironlet_runtime::supervisor::SupervisorConfig::for_current_process(root_dir)
        .context("finding the ironlet binary")?;
    config.backoff.initial = args.agent_restart_backoff;
    config.backoff.max = args
        .agent_restart_backoff_max
        .max(args.agent_restart_backoff);
    match ironlet_runtime::supervisor::run(config).context("starting the supervisor")? {}
}

/// The agent proper, connected to its supervisor.
fn run_agent(
    root_dir: PathBuf,
    rootless: bool,
    args: RunArgs,
    zygote: ironlet_runtime::zygote::ZygoteHandle,
) -> anyhow::Result<ExitCode> {
    // Still single-threaded: the supervisor says so when it got SIGPWR before this start.
    let node_shutting_down =
        std::env::var_os(ironlet_runtime::supervisor::NODE_SHUTDOWN_ENV).is_some();
    std::env::remove_var(ironlet_runtime::supervisor::NODE_SHUTDOWN_ENV);
    let node_name = match args.node_name.clone() {
        Some(n) => n,
        None => nix::unistd::gethostname()
            .context("reading the host name (or pass --node-name)")?
            .to_string_lossy()
            .to_lowercase(),
    };
    let mut config = KubeletConfig::new(node_name, root_dir.clone());
    config.pod_log_dir = args.pod_logs_dir.clone().unwrap_or_else(|| {
        if rootless {
            root_dir.join("logs")
        } else {
            PathBuf::from("/var/log/pods")
        }
    });
    config.manifest_path = args.pod_manifest_path.clone();
    config.manifest_url = args.manifest_url.clone();
    config.sync_frequency = args.sync_frequency;
    config.file_check_frequency = args.file_check_frequency;
    config.http_check_frequency = args.http_check_frequency;
    config.pleg_relist_period = args.pleg_relist_period;
    config.max_pods = args.max_pods;
    let reserved = [args.system_reserved, args.kube_reserved];
    config.reserved_cpu_milli = reserved.iter().flatten().map(|r| r.cpu_milli).sum();
    config.reserved_memory_bytes = reserved.iter().flatten().map(|r| r.memory_bytes).sum();
    config.cgroup_root = format!("{}/kubepods", args.cgroup_root.trim_end_matches('/'));
    config.seccomp_default = args.seccomp_default;
    config.cluster_dns = args.cluster_dns.iter().map(|ip| ip.to_string()).collect();
    config.cluster_domain = args.cluster_domain.trim_end_matches('.').to_owned();
    config.resolv_conf = args.resolv_conf.clone();
    config.allowed_sysctls = ironlet::admission::SysctlAllowlist::new(&args.allowed_unsafe_sysctls)
        .context("--allowed-unsafe-sysctls")?;
    config.cgroup_favor_dynmods = args.cgroup_favor_dynmods;
    if args.max_container_restart_period < Duration::from_secs(1) {
        bail!("--max-container-restart-period must be at least 1s");
    }
    config.max_container_restart_period = args.max_container_restart_period;
    config.gc_policy = ironlet::kubelet::container_gc::GcPolicy {
        min_age: args.minimum_container_ttl_duration,
        max_per_pod_container: args.maximum_dead_containers_per_container,
        max_containers: args.maximum_dead_containers,
    };
    let images = image_settings(&args)?;
    config.image_gc_policy = images.gc_policy;
    config.image_gc_period = args.image_gc_period;
    config.max_parallel_image_pulls = images.max_parallel_pulls;
    config.eviction = EvictionSettings::build(
        &args.eviction_hard,
        &args.eviction_soft,
        &args.eviction_soft_grace_period,
        &args.eviction_minimum_reclaim,
        args.eviction_max_pod_grace_period,
        args.eviction_pressure_transition_period,
    )
    .context("eviction thresholds")?;
    config.shutdown = shutdown_settings(&args)?;
    if args.read_only_port != 0 {
        bail!("--read-only-port is not served by ironlet (unauthenticated); leave it at 0");
    }

    super::heap::limit_arenas();
    let rt = super::agent_runtime()?;
    rt.block_on(async move {
        // First: SIGPWR's default action would end the agent.
        let power_fail =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(libc::SIGPWR))
                .context("listening for SIGPWR")?;
        tokio::spawn(super::heap::trim_every(super::heap::TRIM_PERIOD));
        let store = super::open_images(&root_dir)?;
        // Staging left by a pull or import that a crash interrupted (`ingest/*`,
        // `snapshots/tmp-*`) goes now; gc waits for pulls of other processes in flight.
        let gc_store = store.clone();
        tokio::task::spawn_blocking(move || match gc_store.gc() {
            Ok(report) => tracing::info!(?report, "image store cleaned at start-up"),
            Err(err) => tracing::warn!(%err, "image store clean-up at start-up failed"),
        });
        // Rootless, pods are connected by pasta instead (runtime/src/network/rootless.rs).
        let cni = args.network.cni(&args.pod_cidr);
        let runtime_config = LocalRuntimeConfig {
            root_dir: root_dir.clone(),
            rootless,
            default_cgroup_parent: None,
            cni,
            log_rotation: ironlet_runtime::local::logs::LogRotation {
                max_size: args.container_log_max_size,
                max_files: args.container_log_max_files,
            },
        };
        let runtime = LocalRuntime::new(runtime_config, zygote, store.clone())
            .await
            .with_context(|| format!("opening the runtime at {}", root_dir.display()))?;
        // A rootless pod's pasta connects its network while the first container is created.
        runtime.network_ready_at_start();
        if let Some(recovery) = runtime.recovery() {
            tracing::info!(?recovery, "agent started under the supervisor");
        }
        let pull = super::pull_config(
            &root_dir,
            args.registry_config.as_deref(),
            args.max_concurrent_downloads,
            &args.credential_providers,
        )?;
        let images = Arc::new(
            LocalImageService::with_pull_config(store, pull)
                .with_pinned_images(args.pinned_images.clone())
                .context("--pinned-images")?,
        );
        let socket = config.socket_path();
        let client = match &args.kubeconfig {
            Some(path) => Some(kube_client(path).await?),
            None => None,
        };
        let kubelet_api = match &client {
            Some(client) => Some(bind_kubelet_api(&args, &config, client).await?),
            None => None,
        };
        let machine = ironlet::node::MachineConfig {
            node_name: config.node_name.clone(),
            node_ip: args.node_ip,
            kubelet_port: kubelet_api.as_ref().map(|(api, _, _)| api.port()),
            root_dir: root_dir.clone(),
            max_pods: config.max_pods,
            reserved: ironlet::node::Reserved {
                cpu_milli: config.reserved_cpu_milli,
                memory_bytes: config.reserved_memory_bytes,
                ..Default::default()
            },
            eviction_hard_memory_bytes: config.eviction.hard_amount(
                Signal::MemoryAvailable,
                ironlet_cgroups::MachineUsage::read().map_or(0, |m| m.memory_total_bytes),
            ),
            eviction_hard_nodefs_percent: config
                .eviction
                .hard_percent(Signal::NodeFsAvailable)
                .map_or(0, |p| (p * 100.0).round() as u64),
            ..Default::default()
        };
        let node_name = config.node_name.clone();
        let runtime: Arc<dyn ironlet_runtime::Runtime> = Arc::new(runtime);
        let kubelet = Kubelet::start_with_api(config, runtime.clone(), images, client.clone())
            .await
            .context("starting the node agent")?;
        let node_shutdown = kubelet.node_shutdown();
        let _shutdown_detection = watch_node_shutdown(
            node_shutdown.clone(),
            power_fail,
            node_shutting_down,
            &shutdown_settings(&args)?,
        );
        let (stop_node, node_stopped) = tokio::sync::oneshot::channel::<()>();
        let node_task = match client {
            Some(client) => {
                let image_gc = kubelet.image_gc();
                let max_images = args.node_status_max_images;
                let provider = ironlet::node::MachineStatus::new(machine)
                    .context("reading the machine's capacity")?
                    .with_images(Arc::new(move || image_gc.node_images(max_images)))
                    .with_pressure(kubelet.pressure())
                    .with_shutdown(node_shutdown.shutting_down());
                let health = health_watch(kubelet.view());
                let controller = ironlet::node::NodeController::new(
                    client,
                    ironlet::node::NodeConfig::new(node_name),
                    provider,
                )
                .with_health(health)
                .with_status_refresh(node_shutdown.shutting_down());
                Some(tokio::spawn(controller.run(async move {
                    let _ = node_stopped.await;
                })))
            }
            None => None,
        };
        let server = ironlet::server::Server::bind(&socket).context("starting the local server")?;
        let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(kubelet.view(), kubelet.metrics(), async move {
            let _ = server_stopped.await;
        }));
        let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
        let mut _rotation = None;
        let api_serving = kubelet_api.map(|(api, (authenticator, authorizer), rotation)| {
            _rotation = rotation;
            let services = ironlet::server::kubelet_api::Services {
                view: kubelet.view(),
                metrics: kubelet.metrics(),
                stats: kubelet.stats(),
                probes: kubelet.probe_counts(),
                authenticator,
                authorizer,
                runtime,
            };
            tokio::spawn(api.serve(services, async move {
                let _ = api_stopped.await;
            }))
        });
        tracing::info!(socket = %socket.display(), "ironlet is running");
        kubelet.run(shutdown_signal()).await;
        let _ = stop_server.send(());
        let _ = serving.await;
        let _ = stop_api.send(());
        if let Some(task) = api_serving {
            let _ = task.await;
        }
        let _ = stop_node.send(());
        if let Some(task) = node_task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(%err, "final node status update failed"),
                Err(err) => tracing::warn!(%err, "node controller task failed"),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The pod network flags of `ironlet run` and `ironlet play`.
#[derive(Debug, Clone, Args)]
pub struct PodNetworkArgs {
    /// CNI network configurations; the first by name is used. When none exists, a bridge
    /// network on the pod CIDR is written here.
    #[arg(long = "cni-conf-dir", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Where CNI plugin binaries are searched (comma-separated).
    #[arg(
        long = "cni-bin-dir",
        value_delimiter = ',',
        default_value = "/usr/lib/cni,/opt/cni/bin"
    )]
    pub cni_bin_dir: Vec<PathBuf>,
    /// Run pods without a network beyond loopback (no CNI as root, no pasta rootless).
    #[arg(long = "no-pod-network")]
    pub no_pod_network: bool,
}

impl PodNetworkArgs {
    /// The CNI settings (`pod_cidr`: the subnet of the bridge network written when the
    /// directory has no configuration); `None` with `--no-pod-network`.
    pub(super) fn cni(&self, pod_cidr: &str) -> Option<CniConfig> {
        (!self.no_pod_network).then(|| CniConfig {
            conf_dir: self.cni_conf_dir.clone(),
            bin_dirs: self.cni_bin_dir.clone(),
            default_network: DefaultNetwork {
                subnet: pod_cidr.to_owned(),
                ..DefaultNetwork::default()
            },
            ..CniConfig::default()
        })
    }
}

type ApiAuth = (
    Arc<dyn ironlet::server::kubelet_api::auth::TokenAuthenticator>,
    Arc<dyn ironlet::server::kubelet_api::auth::Authorizer>,
);

/// The serving certificate's rotation task (`--rotate-server-certificates`), stopped on drop.
type RotationTask = Option<AbortOnDrop>;

/// Binds the kubelet API (HTTPS) with its certificate and the API server's webhooks.
async fn bind_kubelet_api(
    args: &RunArgs,
    config: &KubeletConfig,
    client: &kube::Client,
) -> anyhow::Result<(
    ironlet::server::kubelet_api::KubeletApi,
    ApiAuth,
    RotationTask,
)> {
    use ironlet::server::kubelet_api::{auth, tls, KubeletApi, KubeletApiConfig};
    let cert = tls::serving_cert(
        args.tls_cert_file.as_deref(),
        args.tls_private_key_file.as_deref(),
        &config.root_dir.join("pki"),
        &config.node_name,
    )
    .context("loading the kubelet API's serving certificate")?;
    let current = tls::CurrentCert::new(cert).context("loading the serving certificate's key")?;
    let tls = tls::server_config(current.clone(), args.client_ca_file.as_deref())
        .context("configuring the kubelet API's TLS")?;
    let rotation = args.rotate_server_certificates.then(|| {
        let rotation = ironlet::server::kubelet_api::rotation::Rotation {
            client: client.clone(),
            node_name: config.node_name.clone(),
            hostnames: vec![config.node_name.clone()],
            ips: args
                .node_ip
                .or_else(ironlet::node::default_route_ip)
                .into_iter()
                .collect(),
            cert_dir: config.root_dir.join("pki"),
            current,
        };
        AbortOnDrop(tokio::spawn(rotation.run()))
    });
    let api = KubeletApi::bind(KubeletApiConfig {
        address: args.address,
        port: args.port,
        healthz: Some(std::net::SocketAddr::new(
            args.healthz_bind_address,
            args.healthz_port,
        )),
        tls,
        node_name: config.node_name.clone(),
        pod_log_dir: config.pod_log_dir.clone(),
        configz: super::kubelet_config::effective(args, config),
        streaming_idle_timeout: args.streaming_connection_idle_timeout,
    })
    .await
    .context("starting the kubelet API")?;
    let authenticator = Arc::new(auth::ApiTokenAuthenticator::new(client.clone()));
    let authorizer = Arc::new(auth::ApiAuthorizer::new(
        client.clone(),
        config.node_name.clone(),
    ));
    Ok((api, (authenticator, authorizer), rotation))
}

/// A kube client from a kubeconfig file.
async fn kube_client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    ironlet::apiserver::client::client(config).context("building the API client")
}

/// The agent's health (PLEG and sync loop), polled every 5 s, for the node controller.
fn health_watch(view: Arc<dyn ironlet::server::PodsView>) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(true);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            let healthy = view.health().is_ok();
            tx.send_if_modified(|h| std::mem::replace(h, healthy) != healthy);
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Feeds graceful node shutdown (see `ironlet::kubelet::node_shutdown`): SIGPWR (passed on
/// by the supervisor, or told by it at start through `IRONLET_NODE_SHUTDOWN`) and, where
/// systemd booted the machine, logind. The tasks end with the returned guards.
fn watch_node_shutdown(
    shutdown: ironlet::kubelet::node_shutdown::NodeShutdown,
    mut power_fail: tokio::signal::unix::Signal,
    already: bool,
    settings: &ironlet::kubelet::node_shutdown::ShutdownSettings,
) -> Vec<AbortOnDrop> {
    use ironlet::kubelet::node_shutdown::{logind, ShutdownEvent};
    let mut tasks = Vec::new();
    let enabled = settings.enabled();
    let detection = logind::detection(enabled, logind::systemd_booted(std::path::Path::new("/")));
    if enabled {
        tracing::info!(grace_period = ?settings.total(), ?detection, "graceful node shutdown is on");
    }
    if already {
        tracing::info!(
            "the supervisor received SIGPWR before this agent started: the node is shutting down"
        );
        shutdown.send(ShutdownEvent::Start);
    }
    let sigpwr = shutdown.clone();
    tasks.push(AbortOnDrop(tokio::spawn(async move {
        while power_fail.recv().await.is_some() {
            tracing::info!("SIGPWR: the node is shutting down");
            sigpwr.send(ShutdownEvent::Start);
        }
    })));
    if detection == logind::Detection::Logind {
        let total = settings.total();
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            if let Err(err) = logind::watch(shutdown, total).await {
                tracing::error!(%err, "Failed to start node shutdown manager through logind; SIGPWR to the supervisor still works");
            }
        })));
    }
    tasks
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::error!("cannot listen for signals; stop ironlet with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_kubelet_flags_do() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn reservations_parse_cpu_and_memory() {
        let r = parse_reserved("cpu=500m,memory=1Gi");
        assert!(matches!(
            r,
            Ok(Reserved {
                cpu_milli: 500,
                memory_bytes: 1073741824
            })
        ));
        assert!(parse_reserved("gpu=1").is_err());
        assert!(parse_reserved("cpu").is_err());
    }

    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn favor_dynmods(args: &[&str]) -> Result<bool, clap::Error> {
        use clap::Parser;
        let argv = std::iter::once("ironlet").chain(args.iter().copied());
        Wrapper::try_parse_from(argv).map(|w| w.run.cgroup_favor_dynmods)
    }

    #[test]
    fn cgroup_favor_dynmods_is_on_unless_set_to_false_as_kubelet_bools_are() {
        assert!(matches!(favor_dynmods(&[]), Ok(true)));
        assert!(matches!(
            favor_dynmods(&["--cgroup-favor-dynmods"]),
            Ok(true)
        ));
        assert!(matches!(
            favor_dynmods(&["--cgroup-favor-dynmods=false"]),
            Ok(false)
        ));
        assert!(favor_dynmods(&["--cgroup-favor-dynmods=maybe"]).is_err());
    }

    fn gc_flags(args: &[&str]) -> Result<(i64, i64, Duration), clap::Error> {
        use clap::Parser;
        let argv = std::iter::once("ironlet").chain(args.iter().copied());
        Wrapper::try_parse_from(argv).map(|w| {
            (
                w.run.maximum_dead_containers_per_container,
                w.run.maximum_dead_containers,
                w.run.minimum_container_ttl_duration,
            )
        })
    }

    #[test]
    fn pull_limits_follow_kubelet_semantics() {
        assert_eq!(pull_limit(true, None), Ok(Some(1)));
        assert_eq!(pull_limit(true, Some(1)), Ok(Some(1)));
        assert_eq!(pull_limit(false, None), Ok(None));
        assert_eq!(pull_limit(false, Some(4)), Ok(Some(4)));
        let err = pull_limit(true, Some(3)).unwrap_err();
        assert!(
            err.contains("must be 1 or nil when serializeImagePulls"),
            "{err}"
        );
        assert!(pull_limit(false, Some(0))
            .unwrap_err()
            .contains("must be a positive number"));
    }

    #[test]
    fn image_flags_take_kubelet_defaults_and_ironlet_serializes_nothing() {
        use clap::Parser;
        let w = Wrapper::try_parse_from(["ironlet"]).expect("defaults parse");
        assert_eq!(
            (
                w.run.image_gc_high_threshold,
                w.run.image_gc_low_threshold,
                w.run.image_minimum_gc_age,
                w.run.image_maximum_gc_age,
                w.run.node_status_max_images,
                w.run.serialize_image_pulls,
                w.run.max_parallel_image_pulls,
            ),
            (
                85,
                80,
                Duration::from_secs(120),
                Duration::ZERO,
                50,
                false,
                None
            )
        );
        assert!(Wrapper::try_parse_from(["ironlet", "--image-gc-high-threshold=101"]).is_err());
        let w = Wrapper::try_parse_from([
            "ironlet",
            "--serialize-image-pulls",
            "--node-status-max-images=-1",
        ])
        .expect("flags parse");
        assert!(w.run.serialize_image_pulls);
        assert_eq!(w.run.node_status_max_images, -1);
    }

    #[test]
    fn container_gc_flags_take_kubelet_defaults_and_negative_limits() {
        assert!(matches!(gc_flags(&[]), Ok((1, -1, d)) if d == Duration::ZERO));
        let set = gc_flags(&[
            "--maximum-dead-containers-per-container",
            "-1",
            "--maximum-dead-containers=100",
            "--minimum-container-ttl-duration",
            "1m",
        ]);
        assert!(matches!(set, Ok((-1, 100, d)) if d == Duration::from_secs(60)));
        assert!(gc_flags(&["--maximum-dead-containers=many"]).is_err());
    }
}

//! Command-line surface: `ironlet run` (the node agent), `ironlet images …` and `ironlet ctr …`
//! (crictl-like commands that work directly on the data root, no agent needed), and
//! `ironlet pods …` (asks the running agent over its socket), and `ironlet play FILE…` (pod
//! manifests run in the foreground by an in-process agent).
//!
//! Flag names follow the kubelet (`--root-dir`) and crictl/podman habits; exit codes are
//! 0 on success, 1 on an error of ironlet's, and the container's own exit code for
//! `ctr run` and `ctr exec`.

mod ctr;
mod heap;
mod images;
mod kubelet_config;
pub mod output;
mod play;
mod pods;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ironlet_runtime::image::{
    CredentialProviders, ImageStore, ImageStoreConfig, Keyring, PullConfig, RegistriesConfig,
};
use ironlet_runtime::LocalRuntimeConfig;

#[derive(Debug, Parser)]
#[command(
    name = "ironlet",
    version,
    about = "A Kubernetes node agent with an in-process OCI runtime"
)]
pub struct Cli {
    /// Data root (kubelet's --root-dir). Default: /var/lib/ironlet as root,
    /// $XDG_DATA_HOME/ironlet rootless.
    #[arg(long, global = true, env = "IRONLET_ROOT_DIR")]
    pub root_dir: Option<PathBuf>,
    /// More logging (-v info, -vv debug); IRONLET_LOG overrides. Before the command:
    /// `ctr run -v` is docker's --volume.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: static pods from --pod-manifest-path, kept in their desired state.
    Run(Box<run::RunArgs>),
    /// Manage the local image store.
    #[command(subcommand)]
    Images(images::ImagesCommand),
    /// Run and inspect containers directly (crictl-like).
    #[command(subcommand)]
    Ctr(ctr::CtrCommand),
    /// List the running agent's pods, or print one (kubectl-like).
    Pods(pods::PodsArgs),
    /// Run pod manifests (with their ConfigMaps and Secrets) in the foreground with the
    /// agent's semantics, streaming their logs; Ctrl-C stops and removes them
    /// (podman-kube-play-like).
    Play(play::PlayArgs),
}

/// Whether this process runs without root.
pub fn running_rootless() -> bool {
    !nix::unistd::geteuid().is_root()
}

/// Runs a parsed command; `matches` (the same parse) tells which flags were given.
pub fn run(cli: Cli, matches: &clap::ArgMatches) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Images(cmd) => {
            let root = root_dir(&cli.root_dir, running_rootless());
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(images::run(&root, cmd))
        }
        Command::Ctr(cmd) => ctr::run(cli.root_dir, cmd),
        Command::Run(args) => {
            let empty = clap::ArgMatches::default();
            let run_matches = matches.subcommand_matches("run").unwrap_or(&empty);
            run::run(cli.root_dir, *args, run_matches)
        }
        Command::Play(args) => play::run(cli.root_dir, args),
        Command::Pods(args) => pods::run(&root_dir(&cli.root_dir, running_rootless()), args),
    }
}

/// Upper bound of the agent's blocking-pool threads (file, cgroup and image work). Tokio
/// wakes idle pool threads in turn, so with steady work every thread the pool ever grew to
/// stays alive: the pool sits at its high-water mark, and this bound is what makes that a
/// known number (tokio's default is 512). Every blocking task ends on its own (none waits
/// for another blocking task), so a full pool delays work but cannot deadlock.
pub const MAX_BLOCKING_THREADS: usize = 64;

/// Name of the agent's async-runtime threads (workers and blocking pool), so that a leak
/// check can tell them from threads the agent starts itself.
pub const RUNTIME_THREAD_NAME: &str = "ironlet-rt";

/// The multi-threaded async runtime of an agent (`run`, `play`): two workers, a bounded
/// blocking pool.
pub fn agent_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name(RUNTIME_THREAD_NAME)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The data root: `--root-dir` made absolute (the zygote may change its working directory,
/// see `ironlet_runtime`'s worker), else the default for root or rootless.
pub fn root_dir(flag: &Option<PathBuf>, rootless: bool) -> PathBuf {
    match flag {
        Some(dir) => std::path::absolute(dir).unwrap_or_else(|_| dir.clone()),
        None => LocalRuntimeConfig::default_root_dir(rootless),
    }
}

/// kubelet's `--image-credential-provider-config` and `--image-credential-provider-bin-dir`
/// (each requires the other).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CredentialProviderArgs {
    /// kubelet's CredentialProviderConfig (kubelet.config.k8s.io/v1): which plugin supplies
    /// registry credentials for which images.
    #[arg(
        long = "image-credential-provider-config",
        requires = "image_credential_provider_bin_dir"
    )]
    pub image_credential_provider_config: Option<PathBuf>,
    /// The directory holding the credential provider plugin binaries (one per provider name).
    #[arg(
        long = "image-credential-provider-bin-dir",
        requires = "image_credential_provider_config"
    )]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
}

impl CredentialProviderArgs {
    /// The plugins, checked (config and binaries) now so a mistake stops the start.
    pub fn load(&self) -> anyhow::Result<Option<Arc<CredentialProviders>>> {
        match (
            &self.image_credential_provider_config,
            &self.image_credential_provider_bin_dir,
        ) {
            (Some(config), Some(bin_dir)) => Ok(Some(Arc::new(
                CredentialProviders::load(config, bin_dir)
                    .context("failed to register credential provider plugins")?,
            ))),
            _ => Ok(None),
        }
    }
}

/// Pull settings: `--registry-config` (registries.yaml), the node's docker config files
/// (`<root-dir>/config.json`, `~/.docker/config.json`) and the credential provider plugins.
pub fn pull_config(
    root: &std::path::Path,
    registry_config: Option<&std::path::Path>,
    max_concurrent_layers: usize,
    providers: &CredentialProviderArgs,
) -> anyhow::Result<PullConfig> {
    let registries = match registry_config {
        Some(path) => RegistriesConfig::load(path)
            .with_context(|| format!("reading --registry-config {}", path.display()))?,
        None => RegistriesConfig::default(),
    };
    let node_keyring = Keyring::node_files(root).context("reading the node's docker config")?;
    Ok(PullConfig {
        registries,
        node_keyring,
        max_concurrent_layers: max_concurrent_layers.max(1),
        credential_providers: providers.load()?,
        ..PullConfig::default()
    })
}

pub fn open_images(root: &std::path::Path) -> anyhow::Result<Arc<ImageStore>> {
    // Made private before anything is put in it (the runtime narrows an older one too).
    ironlet_runtime::fsutil::private_dir(root)
        .with_context(|| format!("creating the data root {}", root.display()))?;
    let dir = root.join("images");
    let store = ImageStore::open_with(&dir, ImageStoreConfig::default())
        .with_context(|| format!("opening the image store at {}", dir.display()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod network flags of `run` and `play` (one flattened struct).
    fn network_of(argv: &[&str]) -> run::PodNetworkArgs {
        match Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Command::Run(args)) => args.network,
            Ok(Command::Play(args)) => args.network,
            other => panic!("{argv:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn run_and_play_take_the_same_pod_network_flags() {
        let flags = ["--cni-conf-dir", "/c", "--cni-bin-dir", "/a,/b"];
        let run: Vec<&str> = ["ironlet", "run"].into_iter().chain(flags).collect();
        let play: Vec<&str> = ["ironlet", "play"]
            .into_iter()
            .chain(flags)
            .chain(["pod.yaml"])
            .collect();
        for argv in [&run, &play] {
            let network = network_of(argv);
            let cni = network.cni("10.99.0.0/16").expect("a CNI network");
            assert_eq!(cni.conf_dir, PathBuf::from("/c"), "{argv:?}");
            assert_eq!(
                cni.bin_dirs,
                [PathBuf::from("/a"), PathBuf::from("/b")],
                "{argv:?}"
            );
            assert_eq!(cni.default_network.subnet, "10.99.0.0/16");
            let mut off = argv.to_vec();
            off.insert(2, "--no-pod-network");
            assert!(network_of(&off).cni("10.99.0.0/16").is_none(), "{off:?}");
        }
        let defaults = network_of(&["ironlet", "play", "pod.yaml"]);
        assert_eq!(defaults.cni_conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(
            defaults.cni_bin_dir,
            [PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")]
        );
    }
}

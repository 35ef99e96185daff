//! `ironlet images import|ls|pull|pin|unpin|rm|prune`: the image store from the command line.

use super::output::outln;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use ironlet_runtime::image::{
    Credentials, Keyring, LocalImageService, PlatformSpec, PullConfig, PullProgress, PullRequest,
    Reference,
};
use ironlet_runtime::ImageService;

#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Import an OCI layout directory, an OCI archive or a docker-archive tarball.
    Import { path: PathBuf },
    /// List images.
    #[command(alias = "list")]
    Ls {
        /// Only print image ids.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Pull an image from its registry (mirrors, TLS and credentials as the agent uses
    /// them: --registry-config, <root-dir>/config.json, ~/.docker/config.json, credential
    /// provider plugins).
    Pull {
        reference: String,
        /// Credentials for the image's registry, USER:PASS (tried before the node's).
        #[arg(long)]
        creds: Option<String>,
        /// Platform to take from a multi-platform image, os/arch[/variant].
        #[arg(long)]
        platform: Option<String>,
        /// Registry mirrors, TLS and credentials: a k3s registries.yaml, or a directory of
        /// containerd hosts.toml files (DIR/<registry>/hosts.toml).
        #[arg(long = "registry-config")]
        registry_config: Option<PathBuf>,
        /// Layers downloaded at once.
        #[arg(long = "max-concurrent-downloads", default_value_t = 3)]
        max_concurrent_downloads: usize,
        #[command(flatten)]
        credential_providers: super::CredentialProviderArgs,
    },
    /// Pin images: image garbage collection never removes them (CRI's pinned images).
    Pin {
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Unpin images.
    Unpin {
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Remove an image reference.
    #[command(alias = "remove")]
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Remove every image that no container uses (running, or exited and not removed) and
    /// that is not pinned, with the layers and blobs nothing else needs.
    Prune {
        /// Images never removed besides those `images pin` pinned (the agent's
        /// --pinned-images list), comma-separated or repeated.
        #[arg(long = "pinned-images", value_delimiter = ',')]
        pinned_images: Vec<String>,
    },
}

pub async fn run(root: &Path, cmd: ImagesCommand) -> anyhow::Result<ExitCode> {
    let pull_config = match &cmd {
        ImagesCommand::Pull {
            registry_config,
            max_concurrent_downloads,
            credential_providers,
            ..
        } => super::pull_config(
            root,
            registry_config.as_deref(),
            *max_concurrent_downloads,
            credential_providers,
        )?,
        _ => PullConfig::default(),
    };
    let store = super::open_images(root)?;
    if matches!(
        cmd,
        ImagesCommand::Pull { .. } | ImagesCommand::Import { .. }
    ) {
        // What a killed pull or import left (the agent cleans at its start too).
        if let Err(err) = store.clean_staging() {
            tracing::warn!(%err, "cleaning the image store's staging failed");
        }
    }
    let mut service = LocalImageService::with_pull_config(store, pull_config);
    if let ImagesCommand::Prune { pinned_images } = &cmd {
        service = service
            .with_pinned_images(pinned_images.clone())
            .context("--pinned-images")?;
    }
    match cmd {
        ImagesCommand::Pull {
            reference,
            creds,
            platform,
            ..
        } => return pull(&service, &reference, creds.as_deref(), platform.as_deref()).await,
        ImagesCommand::Import { path } => {
            let images = service
                .import(&path)
                .await
                .with_context(|| format!("importing {}", path.display()))?;
            for image in images {
                let name = image.repo_tags.first().cloned().unwrap_or_default();
                outln!("imported {name} {}", image.id)?;
            }
        }
        ImagesCommand::Ls { quiet } => {
            let mut images = service.list_images().await.context("listing images")?;
            images.sort_by(|a, b| a.repo_tags.cmp(&b.repo_tags));
            if !quiet {
                outln!(
                    "{:<50} {:<20} {:<15} {:>10}",
                    "IMAGE",
                    "TAG",
                    "IMAGE ID",
                    "SIZE"
                )?;
            }
            for image in images {
                let short = image.id.trim_start_matches("sha256:");
                let short = &short[..short.len().min(13)];
                if quiet {
                    outln!("{}", image.id)?;
                    continue;
                }
                let tags = if image.repo_tags.is_empty() {
                    vec!["<none>:<none>".to_owned()]
                } else {
                    image.repo_tags.clone()
                };
                for tag in tags {
                    let (repo, t) = tag.rsplit_once(':').unwrap_or((tag.as_str(), "<none>"));
                    outln!(
                        "{repo:<50} {t:<20} {short:<15} {:>10}",
                        human_size(image.size)
                    )?;
                }
            }
        }
        ImagesCommand::Prune { .. } => prune(&service, root).await?,
        ImagesCommand::Pin { references } => return pin(&service, &references, true).await,
        ImagesCommand::Unpin { references } => return pin(&service, &references, false).await,
        ImagesCommand::Rm { references } => {
            let mut failed = false;
            for reference in references {
                // The service removes idempotently (as the kubelet wants); a user naming an
                // image that is not there wants to hear so, as with `crictl rmi`.
                match service.get_image(&reference).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        eprintln!("ironlet: no such image: {reference}");
                        failed = true;
                        continue;
                    }
                    Err(err) => {
                        eprintln!("ironlet: image {reference}: {err}");
                        failed = true;
                        continue;
                    }
                }
                match service.remove_image(&reference).await {
                    Ok(()) => outln!("Deleted: {reference}")?,
                    Err(err) => {
                        eprintln!("ironlet: removing image {reference}: {err}");
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ironlet images pull`: one plain line per step (resolved, each layer, done).
async fn pull(
    service: &LocalImageService,
    reference: &str,
    creds: Option<&str>,
    platform: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let mut keyring = Keyring::default();
    if let Some(c) = creds {
        let creds = Credentials::parse_user_pass(c).context("--creds must be USER:PASS")?;
        let parsed = Reference::parse(reference)?;
        keyring.add(parsed.domain(), creds);
    }
    let platform = platform.map(PlatformSpec::parse).transpose()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let request = PullRequest {
        keyring,
        platform,
        progress: Some(tx),
        pod: None,
    };
    // Progress goes on while stdout is closed (the pull itself completes); only the
    // final line reports a closed stdout, as every command does.
    let printer = async {
        while let Some(p) = rx.recv().await {
            let _ = match p {
                PullProgress::Resolved {
                    manifest,
                    endpoint,
                    layers,
                } => outln!("{reference}: manifest {manifest} from {endpoint}, {layers} layers"),
                PullProgress::LayerReused { digest } => outln!("{digest}: already present"),
                PullProgress::LayerDone { digest, bytes } => {
                    outln!("{digest}: pulled {}", human_size(bytes))
                }
            };
        }
    };
    let (result, ()) = tokio::join!(service.pull_image(reference, request), printer);
    let report = result.with_context(|| format!("pulling {reference}"))?;
    outln!(
        "pulled {reference} {} ({}, {} layers fetched, {} reused, {:.3}s)",
        report.image.id,
        human_size(report.image.size),
        report.layers_fetched,
        report.layers_reused,
        report.duration.as_secs_f64()
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.3}{}", UNITS[unit])
    }
}

/// `ironlet images prune`: what is in use comes from the container records of the data root
/// (those of the agent and of `ctr run`), read without opening the runtime.
async fn prune(service: &LocalImageService, root: &Path) -> anyhow::Result<()> {
    let containers_dir = ironlet_runtime::LocalRuntimeConfig {
        root_dir: root.to_path_buf(),
        rootless: false,
        default_cgroup_parent: None,
        cni: None,
        log_rotation: Default::default(),
    }
    .containers_dir();
    let records = ironlet_runtime::local::record::load_all::<
        ironlet_runtime::local::record::ContainerRecord,
    >(&containers_dir);
    let mut in_use = std::collections::HashSet::new();
    for r in records {
        in_use.insert(r.image_id.clone());
        if let Ok(Some(image)) = service.get_image(&r.config.image).await {
            in_use.insert(image.id);
        }
    }
    let before = service
        .image_stats()
        .await
        .context("measuring the image store")?;
    let images = service.list_images().await.context("listing images")?;
    for image in images {
        if image.pinned || in_use.contains(&image.id) {
            continue;
        }
        service
            .remove_image(&image.id)
            .await
            .with_context(|| format!("removing image {}", image.id))?;
        let names = if image.repo_tags.is_empty() {
            image.repo_digests.join(" ")
        } else {
            image.repo_tags.join(" ")
        };
        outln!("Deleted: {} {names}", image.id)?;
    }
    let after = service
        .image_stats()
        .await
        .context("measuring the image store")?;
    outln!(
        "Total reclaimed space: {}",
        human_size(
            before
                .total_storage_bytes
                .saturating_sub(after.total_storage_bytes)
        )
    )?;
    Ok(())
}

/// `ironlet images pin|unpin`: 1 when a reference names no image.
async fn pin(
    service: &LocalImageService,
    references: &[String],
    pinned: bool,
) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for reference in references {
        let store = service.store().clone();
        let name = reference.clone();
        let found = tokio::task::spawn_blocking(move || store.set_pinned(&name, pinned))
            .await
            .context("pinning")?
            .with_context(|| format!("image {reference}"))?;
        if found {
            outln!(
                "{}: {reference}",
                if pinned { "Pinned" } else { "Unpinned" }
            )?;
        } else {
            eprintln!("ironlet: no such image: {reference}");
            failed = true;
        }
    }
    Ok(ExitCode::from(u8::from(failed)))
}

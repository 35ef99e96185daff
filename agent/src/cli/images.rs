//! `ironlet images import|ls|rm`: the image store from the command line.

use super::output::outln;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use ironlet_runtime::image::LocalImageService;
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
    /// Remove an image reference.
    #[command(alias = "remove")]
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
    },
}

pub async fn run(root: &Path, cmd: ImagesCommand) -> anyhow::Result<ExitCode> {
    let service = LocalImageService::new(super::open_images(root)?);
    match cmd {
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

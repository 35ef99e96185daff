//! The image of the `image-pull` benchmark: an OCI layout whose gzip layers are the files of
//! installed Debian packages, taken from the host's own directories (`/usr/lib/<triplet>`,
//! `/usr/bin`, `/usr/share/doc`, …), each layer one directory capped at a size, so the image
//! has one large layer and several small ones as real images do.
//!
//! ```text
//!  LayerSpec { dir, cap } ─► tar (sorted walk: dirs, files, symlinks; parents first; stop at
//!                            cap) ─► sha256 (diff_id) ─► gzip ─► sha256 (blob) ─► blobs/sha256
//!  config (diff_ids) + manifest (layers) ─► index.json naming `ref_name`
//! ```
//!
//! The layout is pushed to the registry once (skopeo); for `image-pull` only its sizes
//! matter, not which files it holds, so it is whatever the host's packages are.
//!
//! [`build_runnable_layout`] adds, as the bottom layer, what a container needs to run
//! [`RUN_COMMAND`] (`api-pod-start --pull=debian` starts pods of it): merged-/usr Debian's
//! top-level symlinks (`bin -> usr/bin`, `sbin`, `lib`, `lib64`), the command, and the
//! dynamic loader and libraries `ldd` names for it, at their paths under `usr/` (so
//! `/lib64/ld-linux-x86-64.so.2` resolves through `lib64 -> usr/lib64`). The capped
//! directory walks may leave out the command or libc, so they are not relied on.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};

/// One layer: the tree under `dir`, at most `cap` bytes of file content.
#[derive(Debug, Clone, Copy)]
pub struct LayerSpec {
    pub dir: &'static str,
    pub cap: u64,
}

/// About 200 MB unpacked in 9 layers: one of ~100 MB (shared libraries), the rest 2–40 MB.
pub const LAYERS: &[LayerSpec] = &[
    LayerSpec {
        dir: "/usr/lib/x86_64-linux-gnu",
        cap: 100 << 20,
    },
    LayerSpec {
        dir: "/usr/bin",
        cap: 40 << 20,
    },
    LayerSpec {
        dir: "/usr/lib/python3.11",
        cap: 20 << 20,
    },
    LayerSpec {
        dir: "/usr/libexec",
        cap: 12 << 20,
    },
    LayerSpec {
        dir: "/usr/share/doc",
        cap: 8 << 20,
    },
    LayerSpec {
        dir: "/usr/include",
        cap: 6 << 20,
    },
    LayerSpec {
        dir: "/usr/share/locale",
        cap: 4 << 20,
    },
    LayerSpec {
        dir: "/etc",
        cap: 3 << 20,
    },
    LayerSpec {
        dir: "/usr/share/zoneinfo",
        cap: 2 << 20,
    },
];

/// The command the runnable image's config runs (and its pods: `sleep 3600`).
pub const RUN_COMMAND: &str = "/usr/bin/sleep";

/// merged-/usr's top-level symlinks, as Debian's `usrmerge` lays them out.
const MERGED_USR_LINKS: [(&str, &str); 4] = [
    ("bin", "usr/bin"),
    ("sbin", "usr/sbin"),
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
];

/// What [`build_layout`] wrote.
#[derive(Debug, Clone, Default)]
pub struct ImageSizes {
    pub layers: usize,
    /// Sum of the layer tars (what unpacks).
    pub unpacked: u64,
    /// Sum of the gzip blobs (what is downloaded).
    pub compressed: u64,
    /// The largest gzip blob.
    pub largest_compressed: u64,
}

/// Writes into `out` an OCI layout of one image named `ref_name` with `layers` (directories
/// that do not exist on this host are skipped).
pub fn build_layout(out: &Path, layers: &[LayerSpec], ref_name: &str) -> Result<ImageSizes> {
    build(out, layers, ref_name, false)
}

/// [`build_layout`] with a bottom layer that makes [`RUN_COMMAND`] runnable (see the module
/// doc).
pub fn build_runnable_layout(
    out: &Path,
    layers: &[LayerSpec],
    ref_name: &str,
) -> Result<ImageSizes> {
    build(out, layers, ref_name, true)
}

fn build(out: &Path, layers: &[LayerSpec], ref_name: &str, runnable: bool) -> Result<ImageSizes> {
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let mut sizes = ImageSizes::default();
    let mut diff_ids = Vec::new();
    let mut descriptors = Vec::new();
    let base = runnable.then_some(None);
    let specs = layers
        .iter()
        .filter(|s| Path::new(s.dir).is_dir())
        .map(Some);
    for spec in base.into_iter().chain(specs) {
        let layer = match spec {
            Some(spec) => write_layer(&blobs, spec)?,
            None => write_base_layer(&blobs)?,
        };
        sizes.layers += 1;
        sizes.unpacked += layer.tar_size;
        sizes.compressed += layer.blob_size;
        sizes.largest_compressed = sizes.largest_compressed.max(layer.blob_size);
        diff_ids.push(format!("sha256:{}", layer.diff_hex));
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", layer.blob_hex),
            "size": layer.blob_size,
        }));
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Cmd": [RUN_COMMAND, "3600"], "Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let (config_digest, config_size) = put_json(&blobs, &config)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": descriptors,
    });
    let (manifest_digest, manifest_size) = put_json(&blobs, &manifest)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": ref_name},
        }],
    });
    write(&out.join("index.json"), &serde_json::to_vec(&index)?)?;
    write(
        &out.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    Ok(sizes)
}

struct Layer {
    diff_hex: String,
    blob_hex: String,
    tar_size: u64,
    blob_size: u64,
}

/// Tars `spec.dir` through gzip into a staging blob, hashing both streams, and renames
/// the blob to its digest.
fn write_layer(blobs: &Path, spec: &LayerSpec) -> Result<Layer> {
    let mut builder = start_layer(blobs)?;
    let root = Path::new(spec.dir);
    // The parents first (`usr/`, `usr/lib/`), so the tree unpacks on any base.
    let mut parent = PathBuf::new();
    for part in root.iter().skip(1) {
        parent.push(part);
        builder
            .append_path_with_name(Path::new("/").join(&parent), &parent)
            .with_context(|| format!("adding {}", parent.display()))?;
    }
    let mut budget = spec.cap;
    walk(&mut builder, root, &mut budget)?;
    finish_layer(blobs, builder)
}

type LayerBuilder = tar::Builder<Hashing<flate2::write::GzEncoder<Hashing<BufWriter<File>>>>>;

/// A tar writer into `blobs/staging` through gzip, both streams hashed.
fn start_layer(blobs: &Path) -> Result<LayerBuilder> {
    let staging = blobs.join("staging");
    let file = File::create(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let blob = Hashing::new(BufWriter::new(file));
    let gzip = flate2::write::GzEncoder::new(blob, flate2::Compression::default());
    let mut builder = tar::Builder::new(Hashing::new(gzip));
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Deterministic);
    Ok(builder)
}

/// The merged-/usr symlinks, [`RUN_COMMAND`] and the files `ldd` names for it (their
/// content, symlinks followed), each at its path under `usr/`.
fn write_base_layer(blobs: &Path) -> Result<Layer> {
    let mut builder = start_layer(blobs)?;
    let out = std::process::Command::new("ldd")
        .arg(RUN_COMMAND)
        .output()
        .context("running ldd")?;
    anyhow::ensure!(
        out.status.success(),
        "ldd {RUN_COMMAND}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, `/lib64/ld-linux-x86-64.so.2
    // (0x…)`; linux-vdso has no path.
    let ldd = String::from_utf8_lossy(&out.stdout);
    let mut files: Vec<PathBuf> = ldd
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(|w| under_usr(Path::new(w)))
        .collect();
    files.push(under_usr(Path::new(RUN_COMMAND)));
    files.sort();
    files.dedup();
    let mut dirs: Vec<PathBuf> = ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64"]
        .iter()
        .map(PathBuf::from)
        .chain(
            files
                .iter()
                .filter_map(|f| f.parent().map(Path::to_path_buf)),
        )
        .flat_map(|d| d.ancestors().map(Path::to_path_buf).collect::<Vec<_>>())
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder
            .append_data(&mut header, dir, std::io::empty())
            .with_context(|| format!("adding {}", dir.display()))?;
    }
    for (link, target) in MERGED_USR_LINKS {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        builder
            .append_link(&mut header, link, target)
            .with_context(|| format!("adding {link}"))?;
    }
    for file in &files {
        let host = Path::new("/").join(file);
        let content =
            std::fs::read(&host).with_context(|| format!("reading {}", host.display()))?;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o755);
        header.set_size(content.len() as u64);
        builder
            .append_data(&mut header, file, content.as_slice())
            .with_context(|| format!("adding {}", file.display()))?;
    }
    finish_layer(blobs, builder)
}

/// `/lib64/x` → `usr/lib64/x`, `/usr/bin/x` → `usr/bin/x`: where merged /usr keeps it.
fn under_usr(path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    if relative.starts_with("usr") {
        relative.to_path_buf()
    } else {
        Path::new("usr").join(relative)
    }
}

/// Ends the tar and the gzip stream and names the blob by its digest.
fn finish_layer(blobs: &Path, builder: LayerBuilder) -> Result<Layer> {
    let staging = blobs.join("staging");
    let tar = builder.into_inner().context("finishing the tar")?;
    let (gzip, diff, tar_size) = tar.finish();
    let blob = gzip.finish().context("finishing gzip")?;
    let (mut file, blob_digest, blob_size) = blob.finish();
    file.flush().context("writing the layer")?;
    let blob_hex = hex::encode(blob_digest);
    std::fs::rename(&staging, blobs.join(&blob_hex)).context("naming the layer blob")?;
    Ok(Layer {
        diff_hex: hex::encode(diff),
        blob_hex,
        tar_size,
        blob_size,
    })
}

/// Adds `dir`'s entries in name order, depth first, until `budget` bytes of file content
/// are in; entries that are neither directories, files nor symlinks are skipped.
fn walk<W: Write>(builder: &mut tar::Builder<W>, dir: &Path, budget: &mut u64) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if *budget == 0 {
            return Ok(());
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let name = path.strip_prefix("/").unwrap_or(&path);
        let kind = meta.file_type();
        if kind.is_dir() {
            builder
                .append_path_with_name(&path, name)
                .with_context(|| format!("adding {}", path.display()))?;
            walk(builder, &path, budget)?;
        } else if kind.is_symlink() || (kind.is_file() && meta.len() <= *budget) {
            builder
                .append_path_with_name(&path, name)
                .with_context(|| format!("adding {}", path.display()))?;
            if kind.is_file() {
                *budget -= meta.len();
            }
        }
    }
    Ok(())
}

/// A writer that hashes (sha256) and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    fn finish(self) -> (W, [u8; 32], u64) {
        (self.inner, self.hasher.finalize().into(), self.count)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Stores a JSON blob; returns its digest and size.
fn put_json(blobs: &Path, value: &serde_json::Value) -> Result<(String, u64)> {
    let bytes = serde_json::to_vec(value)?;
    let hex = hex::encode(Sha256::digest(&bytes));
    write(&blobs.join(&hex), &bytes)?;
    Ok((format!("sha256:{hex}"), bytes.len() as u64))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

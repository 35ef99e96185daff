//! Where an import reads from: a directory (OCI layout, or an unpacked `docker save`) or a
//! tar archive of one (optionally gzip-compressed), behind one interface.
//!
//! An archive is read once, front to back: every `blobs/sha256/<hex>` entry is streamed into
//! the blob store and verified against its name (a mismatch fails the import at once);
//! small metadata files (`*.json`, `oci-layout`, `repositories`) are kept in memory; any
//! other file (docker-archive `…/layer.tar`) is streamed into the blob store under its
//! computed digest. Symlinks and hard links between archive members (older `docker save`
//! deduplicates layers that way) are followed within the archive only.
//!
//! Guarantees: names taken from manifests are cleaned and may not contain `..`, and every
//! member of a directory source (`index.json`, `oci-layout`, `manifest.json`, configs,
//! `blobs/sha256/*`, `…/layer.tar`) is opened relative to the source directory with
//! `openat2(RESOLVE_BENEATH)`: a symlink (or a symlinked parent) that stays inside is
//! followed, one that leads out (absolute, `..` past the top, `/proc` magic links) is
//! refused, and only regular files are read (a FIFO or device is refused before it could
//! block or stream forever). So an import never reads a file outside the directory or
//! archive it was given; nothing is extracted to disk except as verified,
//! content-addressed blobs.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::beneath::clean_path;
use super::blobs::Expected;
use super::digest::Digest;
use super::error::ImageError;
use super::oci::{Compression, Descriptor, MAX_METADATA_BYTES};
use super::store::ImageStore;
use super::sys;

/// What the source contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    OciLayout,
    DockerArchive,
}

#[derive(Debug)]
enum ArchiveFile {
    Small(Vec<u8>),
    Blob {
        digest: Digest,
        size: u64,
    },
    /// Another member, by cleaned archive path.
    Link(String),
}

#[derive(Debug)]
enum Kind {
    /// The source directory, opened once; members are resolved beneath it.
    Dir(OwnedFd),
    Archive(HashMap<String, ArchiveFile>),
}

/// An opened import source.
#[derive(Debug)]
pub(crate) struct Source {
    path: PathBuf,
    kind: Kind,
    pub format: Format,
}

fn is_metadata_name(name: &str) -> bool {
    name.ends_with(".json")
        || name.ends_with("/json")
        || name == "oci-layout"
        || name == "repositories"
        || name.ends_with("VERSION")
}

impl Source {
    pub(crate) fn open(store: &ImageStore, path: &Path) -> Result<Self, ImageError> {
        let meta = std::fs::metadata(path).map_err(|e| ImageError::io("opening", path, e))?;
        let kind = if meta.is_dir() {
            // The path the user gave may itself be a symlink; everything below it is not
            // followed out of it.
            let dir = File::open(path).map_err(|e| ImageError::io("opening", path, e))?;
            Kind::Dir(OwnedFd::from(dir))
        } else {
            Kind::Archive(scan_archive(store, path)?)
        };
        let mut src = Self {
            path: path.to_path_buf(),
            kind,
            format: Format::OciLayout,
        };
        src.format = if src.exists("oci-layout") && src.exists("index.json") {
            Format::OciLayout
        } else if src.exists("manifest.json") {
            Format::DockerArchive
        } else {
            return Err(ImageError::UnknownFormat {
                path: path.to_path_buf(),
            });
        };
        Ok(src)
    }

    /// `archive.tar:name` or `dir/name`, for errors.
    pub(crate) fn location(&self, name: &str) -> String {
        match &self.kind {
            Kind::Dir(_) => self.path.join(name).display().to_string(),
            Kind::Archive(_) => format!("{}:{name}", self.path.display()),
        }
    }

    /// The file name of the source without archive extensions (`busybox.oci.tar` → `busybox`).
    pub(crate) fn base_name(&self) -> Option<String> {
        let name = self.path.file_name()?.to_str()?;
        let stem = [".oci.tar", ".docker.tar", ".tar.gz", ".tgz", ".tar"]
            .iter()
            .find_map(|ext| name.strip_suffix(ext))
            .unwrap_or(name);
        (!stem.is_empty()).then(|| stem.to_owned())
    }

    fn clean(&self, name: &str) -> Result<String, ImageError> {
        clean_path(Path::new(name))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                ImageError::invalid(
                    self.location(name),
                    "member name",
                    "must not contain '..'".into(),
                )
            })
    }

    fn archive_lookup<'a>(
        files: &'a HashMap<String, ArchiveFile>,
        name: &str,
    ) -> Option<&'a ArchiveFile> {
        let mut cur = name.to_owned();
        for _ in 0..8 {
            match files.get(&cur)? {
                ArchiveFile::Link(next) => cur = next.clone(),
                other => return Some(other),
            }
        }
        None
    }

    fn exists(&self, name: &str) -> bool {
        match &self.kind {
            // A member that cannot be opened safely "exists": reading it reports why.
            Kind::Dir(d) => !matches!(open_member(d, &self.path, name), Ok(None)),
            Kind::Archive(files) => Self::archive_lookup(files, name).is_some(),
        }
    }

    /// Reads a metadata file (at most [`MAX_METADATA_BYTES`]); `None` if it is absent.
    pub(crate) fn read_small(
        &self,
        store: &ImageStore,
        name: &str,
    ) -> Result<Option<Vec<u8>>, ImageError> {
        let name = self.clean(name)?;
        let too_big = || {
            ImageError::invalid(
                self.location(&name),
                "metadata file",
                format!("larger than {MAX_METADATA_BYTES} bytes"),
            )
        };
        match &self.kind {
            Kind::Dir(d) => {
                let path = self.path.join(&name);
                let Some(file) = open_member(d, &self.path, &name)? else {
                    return Ok(None);
                };
                let mut bytes = Vec::new();
                file.take(MAX_METADATA_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| ImageError::io("reading", &path, e))?;
                if bytes.len() as u64 > MAX_METADATA_BYTES {
                    return Err(too_big());
                }
                Ok(Some(bytes))
            }
            Kind::Archive(files) => match Self::archive_lookup(files, &name) {
                None | Some(ArchiveFile::Link(_)) => Ok(None),
                Some(ArchiveFile::Small(b)) => Ok(Some(b.clone())),
                Some(ArchiveFile::Blob { digest, size }) => {
                    if *size > MAX_METADATA_BYTES {
                        return Err(too_big());
                    }
                    store
                        .blobs
                        .read_verified(digest, MAX_METADATA_BYTES)
                        .map(Some)
                }
            },
        }
    }

    /// Puts the blob a descriptor names into the store, verifying digest and size.
    pub(crate) fn ingest_blob(
        &self,
        store: &ImageStore,
        desc: &Descriptor,
    ) -> Result<(), ImageError> {
        let name = format!("blobs/sha256/{}", desc.digest.hex());
        let missing = || ImageError::BlobMissing {
            location: self.location(&name),
            digest: desc.digest.to_string(),
        };
        match &self.kind {
            Kind::Dir(d) => {
                let path = self.path.join(&name);
                let mut file = open_member(d, &self.path, &name)?.ok_or_else(missing)?;
                let expected = Expected {
                    digest: &desc.digest,
                    size: Some(desc.size),
                };
                store
                    .blobs
                    .write(&mut file, Some(expected), &path.display().to_string())
                    .map(|_| ())
            }
            Kind::Archive(files) => match Self::archive_lookup(files, &name) {
                Some(ArchiveFile::Blob { digest, size }) => {
                    if digest != &desc.digest || *size != desc.size {
                        return Err(ImageError::DigestMismatch {
                            location: self.location(&name),
                            expected: desc.digest.to_string(),
                            actual: digest.to_string(),
                            expected_size: Some(desc.size),
                            actual_size: *size,
                        });
                    }
                    Ok(())
                }
                Some(ArchiveFile::Small(bytes)) => {
                    let expected = Expected {
                        digest: &desc.digest,
                        size: Some(desc.size),
                    };
                    let mut r = &bytes[..];
                    store
                        .blobs
                        .write(&mut r, Some(expected), &self.location(&name))
                        .map(|_| ())
                }
                None | Some(ArchiveFile::Link(_)) => Err(missing()),
            },
        }
    }

    /// Puts any member into the store under its computed digest (docker-archive layers).
    pub(crate) fn ingest_file(
        &self,
        store: &ImageStore,
        name: &str,
    ) -> Result<(Digest, u64), ImageError> {
        let name = self.clean(name)?;
        let missing = || ImageError::BlobMissing {
            location: self.location(&name),
            digest: "(unknown)".into(),
        };
        match &self.kind {
            Kind::Dir(d) => {
                let path = self.path.join(&name);
                let mut file = open_member(d, &self.path, &name)?.ok_or_else(missing)?;
                store
                    .blobs
                    .write(&mut file, None, &path.display().to_string())
            }
            Kind::Archive(files) => match Self::archive_lookup(files, &name) {
                Some(ArchiveFile::Blob { digest, size }) => Ok((digest.clone(), *size)),
                Some(ArchiveFile::Small(bytes)) => {
                    let mut r = &bytes[..];
                    store.blobs.write(&mut r, None, &self.location(&name))
                }
                None | Some(ArchiveFile::Link(_)) => Err(missing()),
            },
        }
    }
}

/// Opens the regular file `name` beneath the source directory `dir` (see the module doc);
/// `None` when it does not exist.
fn open_member(dir: &OwnedFd, dir_path: &Path, name: &str) -> Result<Option<File>, ImageError> {
    let location = dir_path.join(name);
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = match sys::open_beneath(dir.as_fd(), Path::new(name), flags, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP)) => {
            tracing::warn!(member = ?location, err = %e, "refusing import member that leads outside its source");
            return Err(ImageError::invalid(
                location.display().to_string(),
                "member",
                "is a symlink (or under one) that leads outside the image directory".into(),
            ));
        }
        Err(e) => return Err(ImageError::io("opening", location, e)),
    };
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| ImageError::io("inspecting", &location, e))?;
    if !meta.is_file() {
        return Err(ImageError::invalid(
            location.display().to_string(),
            "member",
            "is not a regular file".into(),
        ));
    }
    // O_NONBLOCK has no effect on a regular file.
    Ok(Some(file))
}

/// Reads an archive once, storing blobs and keeping metadata (see the module doc).
fn scan_archive(
    store: &ImageStore,
    path: &Path,
) -> Result<HashMap<String, ArchiveFile>, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io("opening", path, e))?;
    let mut buffered = BufReader::with_capacity(1 << 16, file);
    let head = buffered
        .fill_buf()
        .map_err(|e| ImageError::io("reading", path, e))?
        .to_vec();
    let reader: Box<dyn Read> = match Compression::sniff(&head) {
        Some(Compression::Gzip) => Box::new(flate2::read::MultiGzDecoder::new(buffered)),
        _ => Box::new(buffered),
    };
    let mut archive = tar::Archive::new(reader);
    let read_err = |e| ImageError::io("reading archive", path, e);
    let mut files = HashMap::new();
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let raw = entry.path().map_err(read_err)?.into_owned();
        let Ok(clean) = clean_path(&raw) else {
            tracing::warn!(archive = ?path, member = ?raw, "skipping archive member with '..'");
            continue;
        };
        let name = clean.to_string_lossy().into_owned();
        let location = format!("{}:{name}", path.display());
        use tar::EntryType as T;
        let kind = entry.header().entry_type();
        let file = match kind {
            T::Regular | T::Continuous => {
                let size = entry.size();
                let blob_hex = name.strip_prefix("blobs/sha256/");
                if let Some(digest) = blob_hex.and_then(Digest::from_hex) {
                    let expected = Expected {
                        digest: &digest,
                        size: Some(size),
                    };
                    store.blobs.write(&mut entry, Some(expected), &location)?;
                    ArchiveFile::Blob { digest, size }
                } else if is_metadata_name(&name) && size <= MAX_METADATA_BYTES {
                    let mut bytes = Vec::with_capacity(size as usize);
                    entry.read_to_end(&mut bytes).map_err(read_err)?;
                    ArchiveFile::Small(bytes)
                } else {
                    let (digest, size) = store.blobs.write(&mut entry, None, &location)?;
                    ArchiveFile::Blob { digest, size }
                }
            }
            T::Symlink | T::Link => {
                let Some(target) = entry.link_name().map_err(read_err)? else {
                    continue;
                };
                let joined = if kind == T::Symlink {
                    clean.parent().unwrap_or(Path::new("")).join(&target)
                } else {
                    target.into_owned()
                };
                match normalize(&joined) {
                    Some(t) => ArchiveFile::Link(t),
                    None => continue,
                }
            }
            _ => continue,
        };
        files.insert(name, file);
    }
    Ok(files)
}

/// Resolves `.` and `..` lexically within the archive; `None` if it climbs above the top.
fn normalize(p: &Path) -> Option<String> {
    let mut out: Vec<&std::ffi::OsStr> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            std::path::Component::ParentDir => {
                out.pop()?;
            }
            _ => {}
        }
    }
    let joined: PathBuf = out.iter().collect();
    Some(joined.to_string_lossy().into_owned())
}

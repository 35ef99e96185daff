//! kubelet's `AtomicWriter`: the files of a configMap, secret, downwardAPI or projected volume,
//! replaced all at once.
//!
//! Layout of a volume directory:
//!
//! ```text
//! <volume>/
//!   ..2024_05_01_10_00_00.123456789/   the current payload (files and subdirectories)
//!   ..data -> ..2024_05_01_10_00_00.123456789
//!   key    -> ..data/key                one symlink per top-level payload name
//! ```
//!
//! A new payload is written to a fresh timestamped directory, then `..data` is switched to it
//! with a rename of a temporary symlink: a reader following `key` sees either the old or the
//! new payload, never a mix. Then symlinks of names that left the payload and the old
//! directory are removed.
//!
//! Guarantees: a payload equal to the current one (same paths, contents and modes) writes
//! nothing; payload paths are validated first (relative, no `..` component, not starting with
//! `..`, kubelet's length limits), so nothing is written outside the volume directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::SetUpError;

/// The symlink naming the current payload directory.
const DATA_LINK: &str = "..data";
/// The temporary symlink renamed over [`DATA_LINK`].
const DATA_LINK_TMP: &str = "..data_tmp";
/// kubelet's `maxPathLength` and `maxFileNameLength`.
const MAX_PATH: usize = 4096;
const MAX_NAME: usize = 255;

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileProjection {
    pub data: Vec<u8>,
    /// Permission bits (`0o644`…); masked to `0o777` when written.
    pub mode: u32,
}

/// The files of a volume: validated relative path → content.
pub(crate) type Payload = BTreeMap<String, FileProjection>;

/// Validates a payload path (kubelet's `validatePath`) and returns it cleaned of empty and
/// `.` components.
pub(crate) fn clean_path(path: &str) -> Result<String, SetUpError> {
    let invalid = |reason| SetUpError::InvalidPath {
        path: path.to_owned(),
        reason,
    };
    if path.starts_with('/') {
        return Err(invalid("must be relative path"));
    }
    if path.len() > MAX_PATH {
        return Err(invalid("must be less than or equal to 4096 characters"));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        if part == ".." {
            return Err(invalid("must not contain '..'"));
        }
        if part.len() > MAX_NAME {
            return Err(invalid(
                "filenames must be less than or equal to 255 characters",
            ));
        }
        if !part.is_empty() && part != "." {
            parts.push(part);
        }
    }
    match parts.first() {
        None => Err(invalid("must not be empty")),
        Some(first) if first.starts_with("..") => Err(invalid("must not start with '..'")),
        Some(_) => Ok(parts.join("/")),
    }
}

/// Writes `payload` into the volume directory `target` (see the module docs); returns whether
/// anything changed.
/// With `group` set (the pod's `fsGroup`, kubelet's `SetVolumeOwnership`), the payload
/// directory and files belong to that group; the modes already carry its `0440`.
pub(crate) fn write(
    target: &Path,
    payload: &Payload,
    group: Option<u32>,
) -> Result<bool, SetUpError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| SetUpError::Write { path, source }
    };
    let current = current_dir_name(target);
    if let Some(current) = &current {
        if matches_payload(&target.join(current), payload, group).map_err(write_err(target))? {
            ensure_visible_links(target, payload).map_err(write_err(target))?;
            return Ok(false);
        }
    }

    let new_name = create_timestamped_dir(target).map_err(write_err(target))?;
    let new_dir = target.join(&new_name);
    for (path, file) in payload {
        let file_path = new_dir.join(path);
        write_file(&file_path, file, group).map_err(write_err(&file_path))?;
    }
    if let Some(gid) = group {
        std::os::unix::fs::chown(&new_dir, None, Some(gid)).map_err(write_err(&new_dir))?;
    }
    ensure_visible_links(target, payload).map_err(write_err(target))?;

    let tmp_link = target.join(DATA_LINK_TMP);
    remove_if_exists(&tmp_link).map_err(write_err(&tmp_link))?;
    symlink(&new_name, &tmp_link).map_err(write_err(&tmp_link))?;
    fs::rename(&tmp_link, target.join(DATA_LINK)).map_err(write_err(&tmp_link))?;

    remove_stale(target, payload, &new_name).map_err(write_err(target))?;
    Ok(true)
}

/// The payload directory `..data` points at, if it is one of ours.
fn current_dir_name(target: &Path) -> Option<String> {
    let link = fs::read_link(target.join(DATA_LINK)).ok()?;
    let name = link.to_str()?;
    (name.starts_with("..") && !name.contains('/')).then(|| name.to_owned())
}

/// Whether `dir` holds exactly `payload` (paths, contents, modes and, when set, group).
fn matches_payload(dir: &Path, payload: &Payload, group: Option<u32>) -> io::Result<bool> {
    let mut found = BTreeSet::new();
    if !collect_files(dir, dir, &mut found)? {
        return Ok(false);
    }
    if found.len() != payload.len() || !payload.keys().all(|p| found.contains(Path::new(p))) {
        return Ok(false);
    }
    for (path, file) in payload {
        let full = dir.join(path);
        let metadata = fs::symlink_metadata(&full)?;
        if metadata.permissions().mode() & 0o777 != file.mode & 0o777
            || group.is_some_and(|gid| metadata.gid() != gid)
            || fs::read(&full)? != file.data
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Adds the regular files below `dir` (relative to `root`) to `found`; `false` when something
/// other than directories and regular files is present.
fn collect_files(root: &Path, dir: &Path, found: &mut BTreeSet<PathBuf>) -> io::Result<bool> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if !collect_files(root, &entry.path(), found)? {
                return Ok(false);
            }
        } else if kind.is_file() {
            let path = entry.path();
            let relative = path.strip_prefix(root).map_err(io::Error::other)?;
            found.insert(relative.to_path_buf());
        } else {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates `..<UTC timestamp>.<unique>` (mode 0755) in `target` and returns its name.
fn create_timestamped_dir(target: &Path) -> io::Result<String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let stamp = chrono::Utc::now().format("..%Y_%m_%d_%H_%M_%S");
    loop {
        let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{stamp}.{}{unique:04}", std::process::id());
        match fs::DirBuilder::new().mode(0o755).create(target.join(&name)) {
            Ok(()) => {
                fs::set_permissions(target.join(&name), fs::Permissions::from_mode(0o755))?;
                return Ok(name);
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
    }
}

fn write_file(path: &Path, file: &FileProjection, group: Option<u32>) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    fs::write(path, &file.data)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(file.mode & 0o777))
}

/// The first component of every payload path.
fn top_level_names(payload: &Payload) -> BTreeSet<&str> {
    payload
        .keys()
        .map(|p| p.split('/').next().unwrap_or(p))
        .collect()
}

/// Creates `name -> ..data/name` for each top-level payload name that has no entry yet.
fn ensure_visible_links(target: &Path, payload: &Payload) -> io::Result<()> {
    for name in top_level_names(payload) {
        let link = target.join(name);
        match fs::symlink_metadata(&link) {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                symlink(Path::new(DATA_LINK).join(name), &link)?;
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Removes symlinks of names no longer in the payload and every payload directory but
/// `keep` (the old one, and leftovers of an interrupted write).
fn remove_stale(target: &Path, payload: &Payload, keep: &str) -> io::Result<()> {
    let names = top_level_names(payload);
    for entry in fs::read_dir(target)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let kind = entry.file_type()?;
        if name == DATA_LINK || name == keep {
            continue;
        }
        if kind.is_symlink() && !names.contains(name) {
            fs::remove_file(entry.path())?;
        } else if kind.is_dir() && name.starts_with("..") {
            fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(path, data, mode)| {
                (
                    (*path).to_owned(),
                    FileProjection {
                        data: data.as_bytes().to_vec(),
                        mode: *mode,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn paths_are_validated_like_kubelet() {
        assert_eq!(clean_path("a/./b//c").unwrap(), "a/b/c");
        assert_eq!(
            clean_path("..a/x").unwrap_err().to_string(),
            "invalid path: must not start with '..': ..a/x"
        );
        assert!(clean_path("a/..b").is_ok());
        for bad in ["", ".", "/etc/passwd", "a/../b", "..", "..data"] {
            assert!(clean_path(bad).is_err(), "{bad:?}");
        }
        assert!(clean_path(&"x".repeat(256)).is_err());
    }

    #[test]
    fn a_payload_appears_through_data_link_and_top_level_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let p = payload(&[("a", "one", 0o644), ("sub/b", "two", 0o600)]);
        assert!(write(dir.path(), &p, None).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("a")).unwrap(), "one");
        assert_eq!(fs::read_to_string(dir.path().join("sub/b")).unwrap(), "two");
        assert_eq!(
            fs::read_link(dir.path().join("a")).unwrap(),
            Path::new("..data/a")
        );
        let mode = fs::metadata(dir.path().join("sub/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            !write(dir.path(), &p, None).unwrap(),
            "an equal payload writes nothing"
        );
    }

    #[test]
    fn an_owned_payload_is_group_owned_and_rewritten_when_the_group_differs() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: changing a file's group to any gid needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = payload(&[("a", "one", 0o440)]);
        assert!(write(dir.path(), &p, None).unwrap());
        assert!(
            write(dir.path(), &p, Some(4321)).unwrap(),
            "another group is a change"
        );
        let metadata = fs::metadata(dir.path().join("a")).unwrap();
        assert_eq!(metadata.gid(), 4321);
        assert_eq!(metadata.permissions().mode() & 0o777, 0o440);
        let data_dir = fs::metadata(dir.path().join(DATA_LINK)).unwrap();
        assert_eq!(data_dir.gid(), 4321);
        assert!(!write(dir.path(), &p, Some(4321)).unwrap());
    }

    #[test]
    fn an_update_switches_atomically_and_removes_what_left_the_payload() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &payload(&[("a", "one", 0o644), ("gone", "x", 0o644)]),
            None,
        )
        .unwrap();
        let old = fs::read_link(dir.path().join(DATA_LINK)).unwrap();
        assert!(write(dir.path(), &payload(&[("a", "two", 0o644)]), None).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("a")).unwrap(), "two");
        assert!(fs::symlink_metadata(dir.path().join("gone")).is_err());
        assert!(
            !dir.path().join(old).exists(),
            "the old payload directory is removed"
        );
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 3, "..data, its directory and `a`");
    }

    #[test]
    fn a_mode_change_alone_is_an_update() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &payload(&[("a", "one", 0o644)]), None).unwrap();
        assert!(write(dir.path(), &payload(&[("a", "one", 0o400)]), None).unwrap());
        let mode = fs::metadata(dir.path().join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }
}

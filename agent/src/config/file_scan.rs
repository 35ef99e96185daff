//! One read of the static pod path ([`scan`]) and what the file source remembers between reads
//! ([`FileSourceState::step`]) — the pure half of the file source.
//!
//! Which files count (as kubelet's file source): every regular file directly in the directory
//! (symlinks followed), or the path itself when it is a file; names starting with `.` are
//! skipped; subdirectories are not descended into. A path that does not exist holds no pods.
//!
//! The rule for a file that cannot be used (unreadable, empty, or content that does not
//! decode): its error is reported, and the pods it last yielded stay in the set until it is
//! fixed or deleted. A truncated, half-written or mistyped manifest therefore never stops a
//! running static pod; to remove a file's pods, delete the file. (Writers should still write a
//! temporary file and rename it: a write cut inside a list can decode as a smaller valid pod.)
//! Current behaviour: kubelet instead drops such a file's pods at its next periodic re-read.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::error::{DecodeError, ManifestError, ManifestOrigin};
use super::manifest::{read_manifest, ManifestPods, MAX_MANIFEST_BYTES};
use super::update::SourceChange;

/// The outcome of reading one file, shared by the read cache, the source's state and the
/// last set sent (no copy of a pod per holder).
pub type FileRead = Result<Arc<ManifestPods>, ManifestError>;

/// What one read of the static pod path found.
#[derive(Debug)]
pub enum Scan {
    /// The path does not exist: no static pods.
    Missing,
    /// The path exists but could not be listed; nothing is known about its files.
    Unreadable(ManifestError),
    /// Each manifest file and what reading it gave, in path order.
    Files(BTreeMap<PathBuf, FileRead>),
}

/// What identifies one version of a file: any write or rename changes one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The last read of each file, so that a re-read of the directory parses only the files
/// that changed (a write into a directory of N manifests costs one parse, not N).
#[derive(Debug, Default)]
pub struct ReadCache {
    files: BTreeMap<PathBuf, (Stamp, FileRead)>,
}

/// Reads every manifest under `path` for node `node_name`. Blocking: run it off the runtime.
#[cfg(test)]
#[must_use]
pub fn scan(path: &Path, node_name: &str) -> Scan {
    scan_cached(path, node_name, &mut ReadCache::default())
}

/// [`scan`], re-reading only files whose [`Stamp`] changed since the last call with `cache`.
#[must_use]
pub fn scan_cached(path: &Path, node_name: &str, cache: &mut ReadCache) -> Scan {
    let mut seen = BTreeMap::new();
    let scan = scan_with(path, &mut |file: &Path, m: &std::fs::Metadata| {
        let stamp = Stamp::of(m);
        let read = match cache.files.get(file) {
            Some((cached, read)) if *cached == stamp => read.clone(),
            _ => read_file(file, node_name),
        };
        seen.insert(file.to_path_buf(), (stamp, read.clone()));
        read
    });
    cache.files = seen;
    scan
}

fn scan_with(path: &Path, read: &mut dyn FnMut(&Path, &std::fs::Metadata) -> FileRead) -> Scan {
    let read_error = |path: &Path, err: io::Error| ManifestError::Read {
        origin: ManifestOrigin::File(path.to_path_buf()),
        source: Arc::new(err),
    };
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Scan::Missing,
        Err(err) => return Scan::Unreadable(read_error(path, err)),
    };
    let mut files = BTreeMap::new();
    if !metadata.is_dir() {
        files.insert(path.to_path_buf(), read(path, &metadata));
        return Scan::Files(files);
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(err) => return Scan::Unreadable(read_error(path, err)),
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => return Scan::Unreadable(read_error(path, err)),
        };
        let file = entry.path();
        if entry.file_name().as_encoded_bytes().first() == Some(&b'.') {
            continue;
        }
        match std::fs::metadata(&file) {
            Ok(m) if m.is_file() => {
                files.insert(file.clone(), read(&file, &m));
            }
            Ok(m) if m.is_dir() => {
                tracing::debug!(path = %file.display(), "not recursing into manifest subdirectory");
            }
            Ok(_) => {
                tracing::debug!(
                    path = %file.display(),
                    "skipping manifest entry that is not a regular file",
                );
            }
            // A dangling symlink, or an entry that vanished since the listing.
            Err(err) => {
                files.insert(file.clone(), Err(read_error(&file, err)));
            }
        }
    }
    Scan::Files(files)
}

fn read_file(path: &Path, node_name: &str) -> FileRead {
    let origin = ManifestOrigin::File(path.to_path_buf());
    let bytes = read_bounded(path, MAX_MANIFEST_BYTES).map_err(|err| match err {
        Bounded::TooLarge(size) => ManifestError::TooLarge {
            origin: origin.clone(),
            size,
            limit: MAX_MANIFEST_BYTES,
        },
        Bounded::Io(err) => ManifestError::Read {
            origin: origin.clone(),
            source: Arc::new(err),
        },
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        // Most likely truncated by a writer that has not written yet: not "no pods".
        return Err(ManifestError::Decode {
            origin,
            source: DecodeError::Empty,
        });
    }
    read_manifest(&bytes, &origin, node_name).map(Arc::new)
}

/// Why [`read_bounded`] returned no bytes.
enum Bounded {
    /// The file (by its size, or by what it yielded) is larger than the limit.
    TooLarge(u64),
    /// Opening or reading failed.
    Io(io::Error),
}

/// Reads `path` whole unless it is larger than `limit`: refused by its size before reading (a
/// sparse multi-GiB file costs nothing), and by a bounded read for files whose size lies
/// (procfs, a file growing while read).
fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, Bounded> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(Bounded::Io)?;
    let size = file.metadata().map_err(Bounded::Io)?.len();
    let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if size > limit64 {
        return Err(Bounded::TooLarge(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    let read = file
        .take(limit64.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Bounded::Io)?;
    if read > limit {
        return Err(Bounded::TooLarge(read as u64));
    }
    Ok(bytes)
}

/// What one step decided.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// The set to send, when it changed.
    pub change: Option<SourceChange>,
    /// Every current problem, for the problem reporter.
    pub problems: Vec<ManifestError>,
}

/// The file source's memory between scans.
#[derive(Debug, Default)]
pub struct FileSourceState {
    /// What each file last yielded when it could be read and decoded.
    last_good: BTreeMap<PathBuf, Arc<ManifestPods>>,
    /// The files whose pods, in this order, were the last set sent (as
    /// [`SetDeduper`](super::SetDeduper) does, without a copy of the pods).
    sent: Option<Vec<Arc<ManifestPods>>>,
}

impl FileSourceState {
    /// Folds one scan into the state; see the module docs for the rules.
    pub fn step(&mut self, scan: Scan) -> StepOutput {
        let mut problems = Vec::new();
        match scan {
            Scan::Missing => self.last_good.clear(),
            Scan::Unreadable(err) => {
                problems.push(err);
                // Nothing new is known: keep serving what was served.
                return StepOutput {
                    change: None,
                    problems,
                };
            }
            Scan::Files(files) => {
                let mut good = BTreeMap::new();
                for (path, read) in files {
                    match read {
                        Ok(manifest) => {
                            problems.extend(manifest.invalid.iter().cloned());
                            good.insert(path, manifest);
                        }
                        Err(err) => {
                            problems.push(err);
                            if let Some(pods) = self.last_good.remove(&path) {
                                good.insert(path, pods);
                            }
                        }
                    }
                }
                self.last_good = good;
            }
        }
        let current: Vec<Arc<ManifestPods>> = self.last_good.values().cloned().collect();
        fn pods_of(files: &[Arc<ManifestPods>]) -> impl Iterator<Item = &Pod> {
            files.iter().flat_map(|m| m.pods.iter())
        }
        let unchanged = self
            .sent
            .as_deref()
            .is_some_and(|sent| pods_of(sent).eq(pods_of(&current)));
        let change = (!unchanged).then(|| SourceChange::Set(pods_of(&current).cloned().collect()));
        self.sent = Some(current);
        StepOutput { change, problems }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(name: &str, image: &str) -> String {
        format!("kind: Pod\nmetadata: {{name: {name}}}\nspec: {{containers: [{{name: c, image: '{image}'}}]}}\n")
    }

    fn names(change: &Option<SourceChange>) -> Vec<String> {
        match change {
            Some(SourceChange::Set(pods)) => pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect(),
            other => panic!("expected a Set, got {other:?}"),
        }
    }

    #[test]
    fn a_directory_scan_reads_regular_visible_files_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), manifest("h", "i")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b.yaml"), manifest("b", "i")).unwrap();
        let Scan::Files(files) = scan(dir.path(), "n") else {
            panic!("expected files");
        };
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            [&dir.path().join("a.yaml")]
        );
    }

    #[test]
    fn a_file_above_the_size_limit_is_refused_unread_and_the_others_still_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
        let huge = dir.path().join("huge.yaml");
        let file = std::fs::File::create(&huge).unwrap();
        file.set_len(MAX_MANIFEST_BYTES as u64 + 1).unwrap();
        let mut state = FileSourceState::default();
        let out = state.step(scan(dir.path(), "n"));
        assert_eq!(names(&out.change), ["a-n"]);
        let [err @ ManifestError::TooLarge { size, limit, .. }] = &out.problems[..] else {
            panic!("{:?}", out.problems);
        };
        assert_eq!(
            (*size, *limit),
            (MAX_MANIFEST_BYTES as u64 + 1, MAX_MANIFEST_BYTES)
        );
        assert!(
            err.to_string().contains(&huge.display().to_string()),
            "{err}"
        );
        assert!(err.is_whole_manifest());
        // The reported case: a 3 GiB sparse file is refused by its size, not read.
        file.set_len(3 << 30).unwrap();
        let Scan::Files(files) = scan(dir.path(), "n") else {
            panic!("expected files");
        };
        assert!(matches!(
            files[&huge],
            Err(ManifestError::TooLarge {
                size: 0xC000_0000,
                ..
            })
        ));
    }

    #[test]
    fn a_missing_path_holds_no_pods_and_is_not_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = FileSourceState::default();
        let out = state.step(scan(&dir.path().join("nope"), "n"));
        assert_eq!(names(&out.change), Vec::<String>::new());
        assert!(out.problems.is_empty());
    }

    #[test]
    fn a_single_file_path_is_read_as_the_only_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pod.json");
        std::fs::write(&file, r#"{"kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#).unwrap();
        let out = FileSourceState::default().step(scan(&file, "n"));
        assert_eq!(names(&out.change), ["j-n"]);
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_pods_and_reports_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, manifest("a", "i:1")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), manifest("b", "i")).unwrap();
        let mut state = FileSourceState::default();
        assert_eq!(
            names(&state.step(scan(dir.path(), "n")).change),
            ["a-n", "b-n"]
        );

        std::fs::write(&a, "kind: Pod\nmetadata: [broken\n").unwrap();
        let out = state.step(scan(dir.path(), "n"));
        assert!(out.change.is_none(), "the set did not change");
        assert_eq!(out.problems.len(), 1);
        assert_eq!(out.problems[0].origin(), &ManifestOrigin::File(a.clone()));

        std::fs::remove_file(&a).unwrap();
        assert_eq!(names(&state.step(scan(dir.path(), "n")).change), ["b-n"]);
    }

    #[test]
    fn an_emptied_file_keeps_its_pods_until_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, manifest("a", "i:1")).unwrap();
        let mut state = FileSourceState::default();
        assert_eq!(names(&state.step(scan(dir.path(), "n")).change), ["a-n"]);
        std::fs::write(&a, "").unwrap();
        let out = state.step(scan(dir.path(), "n"));
        assert!(out.change.is_none());
        assert!(matches!(
            &out.problems[..],
            [ManifestError::Decode {
                source: DecodeError::Empty,
                ..
            }]
        ));
    }

    #[test]
    fn a_file_broken_from_the_start_contributes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "not: [a pod").unwrap();
        std::fs::write(dir.path().join("b.yaml"), manifest("b", "i")).unwrap();
        let out = FileSourceState::default().step(scan(dir.path(), "n"));
        assert_eq!(names(&out.change), ["b-n"]);
        assert_eq!(out.problems.len(), 1);
    }

    #[test]
    fn an_unreadable_listing_changes_nothing() {
        let mut state = FileSourceState::default();
        let err = ManifestError::Read {
            origin: ManifestOrigin::File("/m".into()),
            source: Arc::new(io::Error::from(io::ErrorKind::PermissionDenied)),
        };
        let out = state.step(Scan::Unreadable(err));
        assert!(out.change.is_none());
        assert_eq!(out.problems.len(), 1);
    }

    #[test]
    fn a_cached_rescan_rereads_only_changed_files_and_forgets_removed_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = |name: &str| {
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: i}}]\n")
        };
        std::fs::write(dir.path().join("a.yaml"), pod("a")).expect("write");
        std::fs::write(dir.path().join("b.yaml"), pod("b")).expect("write");
        let mut cache = ReadCache::default();
        let names = |scan: Scan| -> Vec<String> {
            let Scan::Files(files) = scan else {
                return Vec::new();
            };
            files
                .values()
                .flat_map(|r| r.as_ref().map(|m| m.pods.clone()).unwrap_or_default())
                .filter_map(|p| p.metadata.name)
                .collect()
        };
        assert_eq!(
            names(scan_cached(dir.path(), "n", &mut cache)),
            ["a-n", "b-n"]
        );
        // A file rewritten in place with the same size is still noticed (ctime/mtime).
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::write(dir.path().join("b.yaml"), pod("c")).expect("rewrite");
        assert_eq!(
            names(scan_cached(dir.path(), "n", &mut cache)),
            ["a-n", "c-n"]
        );
        std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
        assert_eq!(names(scan_cached(dir.path(), "n", &mut cache)), ["c-n"]);
        assert_eq!(cache.files.len(), 1);
    }
}

//! Small helpers for cgroup interface files: read, write, parse "flat keyed" files
//! (`key value` per line) and list process ids.
//!
//! Every helper maps I/O errors to [`Error`] variants carrying the file's path; none of them
//! panics on the content of a file.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Reads a whole file.
pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file and parses its trimmed content as a number.
pub(crate) fn read_u64(path: &Path) -> Result<u64> {
    let text = read(path)?;
    parse_u64(path, text.trim())
}

/// Writes `value` with a single `write(2)`, as cgroup files require.
pub(crate) fn write(path: &Path, value: &str) -> Result<()> {
    write_raw(path, value).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

/// Like [`write`] but returns the raw I/O error, for callers that react to its kind.
pub(crate) fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(value.as_bytes())
}

/// Parses a number, naming `path` in the error.
pub(crate) fn parse_u64(path: &Path, text: &str) -> Result<u64> {
    text.parse().map_err(|_| Error::Parse {
        path: path.to_path_buf(),
        reason: format!("expected an unsigned number, found {text:?}"),
    })
}

/// The value of `key` in a flat-keyed file (`memory.stat`, `memory.events`, `cgroup.events`,
/// `memory.oom_control`, `cpu.stat`). `None` if the key is absent.
pub(crate) fn keyed_value(path: &Path, text: &str, key: &str) -> Result<Option<u64>> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| parse_u64(path, v.trim()))
        .transpose()
}

/// Like [`keyed_value`] but a missing key is a parse error.
pub(crate) fn required_keyed_value(path: &Path, text: &str, key: &str) -> Result<u64> {
    keyed_value(path, text, key)?.ok_or_else(|| Error::Parse {
        path: path.to_path_buf(),
        reason: format!("missing key {key:?}"),
    })
}

/// The process ids listed in `dir/cgroup.procs`. A missing directory yields no pids.
pub(crate) fn procs(dir: &Path) -> Result<Vec<i32>> {
    let path = dir.join("cgroup.procs");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::Read { path, source }),
    };
    text.lines()
        .map(|line| {
            line.trim().parse().map_err(|_| Error::Parse {
                path: path.clone(),
                reason: format!("expected a pid, found {line:?}"),
            })
        })
        .collect()
}

/// `dir` and every cgroup directory below it, parents before children. A missing `dir` yields
/// nothing; a subdirectory that vanishes while walking is skipped.
pub(crate) fn subtree(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if dir.is_dir() {
        out.push(dir.to_path_buf());
    }
    let mut next = 0;
    while next < out.len() {
        let entries = match std::fs::read_dir(&out[next]) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                next += 1;
                continue;
            }
            Err(source) => {
                return Err(Error::Read {
                    path: out[next].clone(),
                    source,
                })
            }
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(entry.path());
            }
        }
        next += 1;
    }
    Ok(out)
}

/// All process ids in `dir` and its descendants.
pub(crate) fn procs_recursive(dir: &Path) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for d in subtree(dir)? {
        pids.extend(procs(&d)?);
    }
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_values_are_found_by_exact_key() {
        let path = Path::new("memory.stat");
        let text = "cache 10\ninactive_file 7\ntotal_inactive_file 70\n";
        assert_eq!(keyed_value(path, text, "inactive_file").unwrap(), Some(7));
        assert_eq!(
            keyed_value(path, text, "total_inactive_file").unwrap(),
            Some(70)
        );
        assert_eq!(keyed_value(path, text, "rss").unwrap(), None);
        assert!(required_keyed_value(path, text, "rss").is_err());
    }

    #[test]
    fn garbage_values_are_parse_errors_not_panics() {
        let path = Path::new("memory.events");
        assert!(keyed_value(path, "oom_kill x\n", "oom_kill").is_err());
        assert!(parse_u64(path, "-1").is_err());
    }
}

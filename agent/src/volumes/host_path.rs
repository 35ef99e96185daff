//! hostPath volumes: kubelet's path validation and `type` checks (`pkg/volume/hostpath`).
//!
//! | type                | when missing              | then requires      |
//! |---------------------|---------------------------|--------------------|
//! | `""` (unset)        | nothing checked           | —                  |
//! | `DirectoryOrCreate` | created (0755, parents)   | —                  |
//! | `Directory`         | error                     | a directory        |
//! | `FileOrCreate`      | created empty (0644)      | —                  |
//! | `File`              | error                     | a regular file     |
//! | `Socket`, `CharDevice`, `BlockDevice` | error   | that file type     |
//!
//! Types are read with `stat` (symlinks followed). The host path itself is never modified
//! otherwise, and teardown never touches it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::error::SetUpError;

/// A file type kubelet recognises, named as `v1.HostPathType` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileType {
    Directory,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileType {
    fn name(self) -> &'static str {
        match self {
            Self::Directory => "Directory",
            Self::File => "File",
            Self::Socket => "Socket",
            Self::CharDevice => "CharDevice",
            Self::BlockDevice => "BlockDevice",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Directory => "directory",
            Self::File => "file",
            Self::Socket => "socket file",
            Self::CharDevice => "character device",
            Self::BlockDevice => "block device",
        }
    }
}

/// Validates `path` and checks it against `type_` (see the module docs).
pub(crate) fn check(path: &str, type_: Option<&str>) -> Result<(), SetUpError> {
    let invalid = |reason| SetUpError::InvalidHostPath {
        path: path.to_owned(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(invalid("must be an absolute path"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(invalid("must not contain '..'"));
    }
    let (create, expected) = match type_.unwrap_or_default() {
        "" => return Ok(()),
        "DirectoryOrCreate" => (Some(FileType::Directory), FileType::Directory),
        "Directory" => (None, FileType::Directory),
        "FileOrCreate" => (Some(FileType::File), FileType::File),
        "File" => (None, FileType::File),
        "Socket" => (None, FileType::Socket),
        "CharDevice" => (None, FileType::CharDevice),
        "BlockDevice" => (None, FileType::BlockDevice),
        other => {
            return Err(SetUpError::InvalidHostPathType {
                type_: other.to_owned(),
            })
        }
    };
    let host = Path::new(path);
    if create.is_some() && fs::metadata(host).is_err() {
        return make(host, expected).map_err(|source| SetUpError::Create {
            path: host.to_path_buf(),
            source,
        });
    }
    let metadata = fs::metadata(host).map_err(|_| SetUpError::HostPathMissing {
        path: path.to_owned(),
    })?;
    let unknown = |reason: &str| SetUpError::HostPathUnknownType {
        path: path.to_owned(),
        expected: expected.description(),
        reason: reason.to_owned(),
    };
    let kind = metadata.file_type();
    let actual = if kind.is_dir() {
        FileType::Directory
    } else if kind.is_file() {
        FileType::File
    } else if kind.is_socket() {
        FileType::Socket
    } else if kind.is_char_device() {
        FileType::CharDevice
    } else if kind.is_block_device() {
        FileType::BlockDevice
    } else {
        return Err(unknown(
            "only recognise file, directory, socket, block device and character device",
        ));
    };
    if actual == expected {
        Ok(())
    } else {
        Err(SetUpError::HostPathType {
            path: path.to_owned(),
            expected: expected.description(),
            actual: actual.name(),
        })
    }
}

/// kubelet's `makeDir` (with parents) and `makeFile` (parent must exist).
fn make(path: &Path, kind: FileType) -> io::Result<()> {
    match kind {
        FileType::Directory => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path),
        _ => fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_backstepping_paths_are_invalid() {
        assert_eq!(
            check("/a/../b", None).unwrap_err().to_string(),
            "invalid HostPath `/a/../b`: must not contain '..'"
        );
        assert!(check("rel", Some("Directory")).is_err());
        assert!(check("/a/..b", None).is_ok());
    }

    #[test]
    fn an_unknown_type_is_refused_and_an_unset_one_checks_nothing() {
        assert_eq!(
            check("/", Some("Weird")).unwrap_err().to_string(),
            "Weird is an invalid volume type"
        );
        assert!(check("/does/not/exist", None).is_ok());
    }
}

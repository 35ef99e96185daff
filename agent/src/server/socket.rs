//! The server's Unix socket file: claimed on bind, removed when the server stops.
//!
//! Guarantees:
//! - A socket file that accepts connections is never taken over: binding fails with
//!   [`ServerError::AlreadyRunning`]. A socket file nobody listens on (left by a crashed agent)
//!   is removed and replaced. Any other kind of file at the path is left alone (an error).
//! - The socket is mode 0600 (owner only) before the first connection is accepted.
//! - [`SocketFile`]'s drop (after the listener closed) removes the file only if it is still
//!   the one this process bound (same device and inode) and nothing accepts connections on
//!   it, so a stopping agent never deletes a newer agent's socket.
//!
//! Current behaviour, not contract: two agents starting at the same instant on a stale file
//! may both see it stale; the later bind wins the path. A lock file would close that window.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::ServerError;

/// The bound socket file; removes itself on drop.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

/// Binds a listener at `path`, replacing a stale socket file.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), ServerError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServerError::AlreadyRunning { path: path.into() });
            }
            tracing::info!(?path, "removing a stale socket file");
            std::fs::remove_file(path).map_err(|source| ServerError::RemoveStale {
                path: path.into(),
                source,
            })?;
        }
        Ok(_) => return Err(ServerError::NotASocket { path: path.into() }),
        Err(err) if err.kind() == ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ServerError::Inspect {
                path: path.into(),
                source,
            })
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::CreateDir {
            path: dir.into(),
            source,
        })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| ServerError::Bind {
        path: path.into(),
        source,
    })?;
    let id = match std::fs::metadata(path) {
        Ok(meta) => (meta.dev(), meta.ino()),
        Err(source) => {
            let _ = std::fs::remove_file(path);
            return Err(ServerError::Inspect {
                path: path.into(),
                source,
            });
        }
    };
    if let Err(source) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(ServerError::Permissions {
            path: path.into(),
            source,
        });
    }
    let file = SocketFile {
        path: path.into(),
        id,
    };
    Ok((listener, file))
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    /// Call after the listener is closed: a socket that still accepts connections then
    /// belongs to another server.
    fn drop(&mut self) {
        let same_file = std::fs::symlink_metadata(&self.path)
            .map(|m| (m.dev(), m.ino()) == self.id)
            .unwrap_or(false);
        // Inode numbers are reused at once on some file systems, hence the liveness check.
        if same_file && std::os::unix::net::UnixStream::connect(&self.path).is_err() {
            if let Err(err) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = ?self.path, ?err, "removing the socket file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binding_makes_an_owner_only_socket_and_drop_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ironlet.sock");
        let (listener, file) = bind(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        drop(listener);
        drop(file);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ironlet.sock");
        // A socket file left behind by a listener that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let (_listener, _file) = bind(&path).unwrap();
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, ServerError::AlreadyRunning { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "another ironlet is running: {} accepts connections",
                path.display()
            )
        );
    }

    #[tokio::test]
    async fn a_regular_file_at_the_path_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ironlet.sock");
        std::fs::write(&path, "mine").unwrap();
        assert!(matches!(bind(&path), Err(ServerError::NotASocket { .. })));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
    }

    #[tokio::test]
    async fn drop_keeps_a_socket_that_another_server_bound_since() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ironlet.sock");
        let (listener, old) = bind(&path).unwrap();
        drop(listener);
        // Another agent replaces the (now stale) socket before the old one finishes stopping.
        let (_listener, _new) = bind(&path).unwrap();
        drop(old);
        assert!(path.exists(), "the newer socket survives");
    }
}

//! The agent's local HTTP server: kubelet's read-only endpoints (`/healthz`, `/pods`,
//! `/metrics`) on a Unix socket at `<root-dir>/ironlet.sock`, for `ironlet pods` and for
//! scrapers on the node.
//!
//! ```text
//!  ironlet pods ──► ironlet.sock ──► accept ──► one task per connection:
//!  curl --unix-socket                          read_request (limits, timeout)
//!                                              └─► routes::route ──► PodsView / Metrics
//!                                              └─► write response, close
//! ```
//!
//! Guarantees:
//! - One request per connection (`Connection: close`); a malformed or oversized request is
//!   answered with its 4xx/5xx and never stops the server.
//! - At most [`MAX_CONNECTIONS`] connections are served at once and each is bounded by
//!   [`REQUEST_TIMEOUT`] to read and [`WRITE_TIMEOUT`] to write, so a slow or stuck client
//!   holds a bounded amount of memory for a bounded time.
//! - The socket file is owner-only (0600) and is removed when [`Server::serve`] returns,
//!   whether by shutdown or error (see [`socket`] for the stale/live rules at bind time).
//! - After `shutdown` resolves no new connection is accepted; connections in flight get
//!   [`SHUTDOWN_GRACE`] to finish and are then dropped.
//!
//! The data comes from the lead's [`PodsView`]; its methods are called on the async
//! runtime and must return quickly (a copy of cached state), never block on the runtime.

pub mod client;
pub mod http;
pub mod kubelet_api;
mod metrics;
pub mod registry;
mod routes;
mod socket;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use self::http::Response;
pub use self::metrics::{Metrics, POD_STARTUP_BUCKETS};
use self::socket::SocketFile;

/// The socket's file name under the root directory.
pub const SOCKET_NAME: &str = "ironlet.sock";
/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send its whole request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to take the whole response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Time connections in flight get to finish after shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The socket path under a root directory: `<root>/ironlet.sock`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(SOCKET_NAME)
}

/// What the server shows; implemented by the agent.
pub trait PodsView: Send + Sync + 'static {
    /// Every pod the agent knows, with its computed `status` filled in.
    fn pods(&self) -> Vec<Pod>;
    /// The pod `namespace`/`name` with its status, if the agent knows it. The default looks
    /// through [`Self::pods`]; a view that can should copy only the one pod (a follower of
    /// `kubectl logs -f` asks several times a second).
    fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods()
            .into_iter()
            .find(|p| pod_is_named(p, namespace, name))
    }
    /// The status of the pod `namespace`/`name`; see [`Self::pod`].
    fn pod_status(&self, namespace: &str, name: &str) -> Option<PodStatus> {
        self.pod(namespace, name)?.status
    }
    /// `Err(reason)` makes `/healthz` answer 500 with the reason.
    fn health(&self) -> Result<(), String>;
}

/// Whether `pod` is `namespace`/`name` (no namespace: `default`).
pub fn pod_is_named(pod: &Pod, namespace: &str, name: &str) -> bool {
    pod.metadata.namespace.as_deref().unwrap_or("default") == namespace
        && pod.metadata.name.as_deref() == Some(name)
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("another ironlet is running: {path} accepts connections")]
    AlreadyRunning { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("inspecting {path}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing the stale socket {path}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating the directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("restricting {path} to its owner")]
    Permissions {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A bound server, not yet serving: bind early to fail start-up fast when another agent
/// runs, serve later.
#[derive(Debug)]
pub struct Server {
    // Field order matters: the listener closes before the file's drop checks liveness.
    listener: UnixListener,
    file: SocketFile,
}

/// Binds `socket` and serves until `shutdown` resolves.
pub async fn serve(
    socket: &Path,
    view: Arc<dyn PodsView>,
    metrics: Arc<Metrics>,
    shutdown: impl Future,
) -> Result<(), ServerError> {
    Server::bind(socket)?.serve(view, metrics, shutdown).await;
    Ok(())
}

impl Server {
    /// Claims the socket file (see [`socket`] for the rules). Needs a tokio runtime.
    pub fn bind(socket: &Path) -> Result<Self, ServerError> {
        let (listener, file) = socket::bind(socket)?;
        Ok(Self { listener, file })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Serves until `shutdown` resolves, then removes the socket file.
    pub async fn serve(
        self,
        view: Arc<dyn PodsView>,
        metrics: Arc<Metrics>,
        shutdown: impl Future,
    ) {
        let Self { listener, file } = self;
        tracing::info!(path = ?file.path(), "serving");
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            // Forget finished connections so the set stays as small as the open ones.
            while connections.try_join_next().is_some() {}
            let next = next_connection(&slots, shutdown.as_mut(), || async {
                listener.accept().await.map(|(stream, _)| stream)
            });
            let Some((stream, permit)) = next.await else {
                break;
            };
            let (view, metrics) = (Arc::clone(&view), Arc::clone(&metrics));
            connections.spawn(async move {
                handle(stream, &*view, &metrics).await;
                drop(permit);
            });
        }
        drop(listener);
        drop(file);
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
            tracing::debug!("dropping connections still open after shutdown");
        }
    }
}

/// Waits for a free connection slot, then for the next connection; `None` once `shutdown`
/// resolves (or the slots are closed). Accept errors (EMFILE and friends) are logged and
/// retried after a pause instead of spinning.
pub(crate) async fn next_connection<S, F, Fut>(
    slots: &Arc<Semaphore>,
    mut shutdown: std::pin::Pin<&mut impl Future>,
    mut accept: F,
) -> Option<(S, tokio::sync::OwnedSemaphorePermit)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<S>>,
{
    let permit = tokio::select! {
        _ = shutdown.as_mut() => return None,
        permit = Arc::clone(slots).acquire_owned() => permit.ok()?,
    };
    loop {
        tokio::select! {
            _ = shutdown.as_mut() => return None,
            accepted = accept() => match accepted {
                Ok(stream) => return Some((stream, permit)),
                Err(err) => {
                    tracing::warn!(?err, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Serves one request on one connection.
async fn handle(mut stream: UnixStream, view: &dyn PodsView, metrics: &Metrics) {
    let limits = http::Limits::default();
    let read = tokio::time::timeout(REQUEST_TIMEOUT, http::read_request(&mut stream, &limits));
    let (response, head_only) = match read.await {
        Err(_) => (
            Response::text(408, "timed out reading the request\n"),
            false,
        ),
        Ok(Err(http::ReadError::Closed)) => return,
        Ok(Err(http::ReadError::Io(err))) => {
            tracing::debug!(?err, "reading a request");
            return;
        }
        Ok(Err(http::ReadError::Http(err))) => {
            tracing::debug!(%err, "refusing a malformed request");
            (Response::for_error(&err), false)
        }
        Ok(Ok(request)) => {
            tracing::trace!(method = %request.method, path = %request.path, "request");
            (
                routes::route(&request, view, metrics),
                request.method == "HEAD",
            )
        }
    };
    let bytes = response.to_bytes(head_only);
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(?err, "writing a response"),
        Err(_) => tracing::debug!("timed out writing a response"),
    }
}

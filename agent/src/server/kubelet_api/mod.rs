//! The kubelet API: HTTPS on `--port` (10250) for the API server and `kubectl`, and plain
//! `/healthz` on `--healthz-port` (10248, loopback), as kubelet serves them.
//!
//! ```text
//!  TCP accept ──► TLS handshake (serving cert, optional client cert from --client-ca-file)
//!             ──► read one request (http::read_request: limits, timeout)
//!             ──► authenticate: client cert subject, else Bearer token → TokenReview  (401)
//!             ──► authorize: SubjectAccessReview on nodes/<subresource>               (403)
//!             ──► /containerLogs/…  streamed (logs)
//!                 /exec/… /attach/…  upgraded to WebSocket (exec) or SPDY/3.1
//!                   (exec_spdy), the process's or the container's stdio, with a terminal
//!                   for tty=1
//!                 /portForward/…  SPDY/3.1, plain or tunnelled in WebSocket (portforward)
//!                 /stats/summary /metrics/resource  (stats, from the StatsProvider)
//!                 /metrics/probes  (prober_probe_total of the probe workers)
//!                 /runningpods/  (pods with a running container, as kubelet lists them)
//!                 /pods /healthz /metrics  (the local server's routes)
//! ```
//!
//! One request per connection (`Connection: close`); a streamed answer has no length and
//! ends when the connection closes. A client that goes away ends its task (a following
//! log reader watches the connection while it waits); shutdown aborts every connection.

pub mod auth;
pub mod exec;
pub mod exec_spdy;
pub mod logs;
pub mod portforward;
pub mod rotation;
pub mod spdy;
pub mod stats;
pub mod tls;
pub mod x509;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironlet_runtime::types::{ContainerId, ExecRequest};
use ironlet_runtime::Runtime;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use self::auth::{Authorizer, TokenAuthenticator, User};
use super::http::{self, Request, Response};
use super::{Metrics, PodsView, REQUEST_TIMEOUT, WRITE_TIMEOUT};

/// kubelet's `--port` and `--healthz-port` defaults.
pub const DEFAULT_PORT: u16 = 10250;
pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;
/// Connections served at once on the API port.
pub const MAX_CONNECTIONS: usize = 256;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the API is served.
#[derive(Clone)]
pub struct KubeletApiConfig {
    /// `--address` (kubelet: 0.0.0.0).
    pub address: IpAddr,
    /// `--port`; 0 picks a free port (tests), reported through [`KubeletApi::port`].
    pub port: u16,
    /// `--healthz-bind-address` / `--healthz-port`; port 0 turns it off.
    pub healthz: Option<SocketAddr>,
    pub tls: Arc<rustls::ServerConfig>,
    pub node_name: String,
    /// The pod log root (`<dir>/<ns>_<pod>_<uid>/<container>/<n>.log`).
    pub pod_log_dir: PathBuf,
    /// The effective `KubeletConfiguration` (with `kind` and `apiVersion`), served on
    /// `/configz` as kubelet's `{"kubeletconfig": …}`.
    pub configz: serde_json::Value,
    /// `--streaming-connection-idle-timeout`: a port-forward session without traffic for
    /// this long is closed.
    pub streaming_idle_timeout: Duration,
}

/// What the handlers read and whom they ask.
#[derive(Clone)]
pub struct Services {
    pub view: Arc<dyn PodsView>,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<dyn stats::StatsProvider>,
    /// `/metrics/probes`.
    pub probes: Arc<crate::probes::ProbeCounts>,
    pub authenticator: Arc<dyn TokenAuthenticator>,
    pub authorizer: Arc<dyn Authorizer>,
    /// Runs `exec` processes.
    pub runtime: Arc<dyn Runtime>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("binding {address}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Bound listeners, not yet serving.
pub struct KubeletApi {
    config: KubeletApiConfig,
    listener: TcpListener,
    healthz: Option<TcpListener>,
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ApiError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ApiError::Bind { address, source })
}

impl KubeletApi {
    pub async fn bind(config: KubeletApiConfig) -> Result<Self, ApiError> {
        let listener = bind(SocketAddr::new(config.address, config.port)).await?;
        let healthz = match config.healthz {
            Some(address) if address.port() != 0 => Some(bind(address).await?),
            _ => None,
        };
        Ok(Self {
            config,
            listener,
            healthz,
        })
    }

    /// The port the API listens on (the real one when `--port 0`).
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Serves until `shutdown` resolves; then every open connection is dropped.
    pub async fn serve(self, services: Services, shutdown: impl Future) {
        let Self {
            config,
            listener,
            healthz,
        } = self;
        tracing::info!(address = ?listener.local_addr().ok(), "serving the kubelet API");
        let mut config = config;
        // `/configz` shows the port bound (the real one when `--port 0`).
        if let (Some(fields), Ok(address)) = (config.configz.as_object_mut(), listener.local_addr())
        {
            if fields.contains_key("port") {
                fields.insert("port".into(), address.port().into());
            }
        }
        let config = Arc::new(config);
        let acceptor = tokio_rustls::TlsAcceptor::from(config.tls.clone());
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        if let Some(healthz) = healthz {
            connections.spawn(serve_healthz(healthz, services.view.clone()));
        }
        tokio::pin!(shutdown);
        loop {
            while connections.try_join_next().is_some() {}
            let next = super::next_connection(&slots, shutdown.as_mut(), || async {
                listener.accept().await.map(|(stream, _)| stream)
            });
            let Some((stream, permit)) = next.await else {
                break;
            };
            let (acceptor, config, services) = (acceptor.clone(), config.clone(), services.clone());
            connections.spawn(async move {
                connection(stream, acceptor, &config, &services).await;
                drop(permit);
            });
        }
        connections.shutdown().await;
    }
}

/// Plain HTTP `/healthz` (kubelet's healthz server), nothing else.
async fn serve_healthz(listener: TcpListener, view: Arc<dyn PodsView>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let view = view.clone();
        connections.spawn(async move {
            let limits = http::Limits::default();
            let read =
                tokio::time::timeout(REQUEST_TIMEOUT, http::read_request(&mut stream, &limits));
            let response = match read.await {
                Ok(Ok(request))
                    if auth::attributes("GET", &request.path).subresources[0] == "healthz" =>
                {
                    match view.health() {
                        Ok(()) => Response::text(200, "ok"),
                        Err(reason) => {
                            Response::text(500, format!("healthz check failed: {reason}\n"))
                        }
                    }
                }
                Ok(Ok(_)) => Response::text(404, "404 page not found\n"),
                _ => return,
            };
            let _ =
                tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&response.to_bytes(false)))
                    .await;
        });
    }
}

async fn connection(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    config: &KubeletApiConfig,
    services: &Services,
) {
    let _ = stream.set_nodelay(true);
    let accepted = Instant::now();
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(%err, "TLS handshake refused");
            return;
        }
        Err(_) => return,
    };
    let cert_user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| x509::subject(leaf))
        .map(|(cn, orgs)| User::named(cn, orgs));
    let (mut reader, mut writer) = tokio::io::split(tls);
    let limits = http::Limits::default();
    let request =
        match tokio::time::timeout(REQUEST_TIMEOUT, http::read_request(&mut reader, &limits)).await
        {
            Err(_) => {
                respond(
                    &mut writer,
                    Response::text(408, "timed out reading the request\n"),
                )
                .await;
                return;
            }
            Ok(Err(http::ReadError::Http(err))) => {
                respond(&mut writer, Response::for_error(&err)).await;
                return;
            }
            Ok(Err(_)) => return,
            Ok(Ok(request)) => request,
        };
    let received = Instant::now();
    let user = match authenticate(cert_user, &request, services).await {
        Some(user) => user,
        None => {
            respond(&mut writer, Response::text(401, "Unauthorized")).await;
            return;
        }
    };
    if let Err(response) = authorize(&user, &request, config, services).await {
        respond(&mut writer, response).await;
        return;
    }
    tracing::debug!(user = %user.name, method = %request.method, path = %request.path, authorized_in = ?received.elapsed(), "kubelet API request");
    let segments: Vec<&str> = request.path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["containerLogs", namespace, pod, container] => {
            let response = container_logs(namespace, pod, container, &request, config, services);
            match response {
                Err(response) => respond(&mut writer, response).await,
                Ok((path, opts, running)) => {
                    let mut sink = ConnectionSink {
                        reader,
                        writer,
                        started: false,
                    };
                    if let Err(err) = logs::stream(&path, &opts, &mut sink, running).await {
                        tracing::debug!(%err, path = %path.display(), "streaming a log");
                    }
                    if sink.started {
                        let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.writer.shutdown()).await;
                    } else {
                        let failed = Response::text(500, "reading the log failed\n");
                        respond(&mut sink.writer, failed).await;
                    }
                }
            }
        }
        [verb @ ("exec" | "attach"), namespace, pod, container] => {
            let attach = *verb == "attach";
            let target = exec_target(namespace, pod, container, &request, services, attach);
            match target {
                Err(response) => respond(&mut writer, response).await,
                Ok((id, opts, head, transport)) => {
                    let mut stream = reader.unsplit(writer);
                    let wrote = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&head)).await;
                    if !matches!(wrote, Ok(Ok(()))) {
                        return;
                    }
                    let runtime = services.runtime.clone();
                    let exec = ExecRequest {
                        cmd: opts.command.clone(),
                        stdin: opts.stdin,
                        tty: opts.tty,
                    };
                    let start = async move {
                        let session = if attach {
                            runtime.attach(&id, &exec).await
                        } else {
                            runtime.exec(&id, &exec).await
                        };
                        tracing::debug!(since_request = ?received.elapsed(), ok = session.is_ok(), "exec process started");
                        session.map_err(|e| e.to_string())
                    };
                    let code = match transport {
                        ExecTransport::WebSocket(protocol) => {
                            exec::serve(stream, protocol, &opts, start).await
                        }
                        ExecTransport::Spdy(version) => {
                            exec_spdy::serve(stream, version, &opts, start).await
                        }
                    };
                    // The timings of a debug run: TLS handshake and request (from the
                    // connection's accept), authorization and upgrade, then the whole exec
                    // until its status was sent and the stream closed.
                    tracing::debug!(
                        ?code,
                        command = ?opts.command,
                        attach,
                        tty = opts.tty,
                        handshake_and_request = ?received.duration_since(accepted),
                        since_request = ?received.elapsed(),
                        "exec ended"
                    );
                }
            }
        }
        ["portForward", namespace, pod] | ["portForward", namespace, pod, _] => {
            let uid = segments.get(3).copied();
            match port_forward_target(namespace, pod, uid, &request, services).await {
                Err(response) => respond(&mut writer, response).await,
                Ok((target, head, upgrade)) => {
                    let mut stream = reader.unsplit(writer);
                    let wrote = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&head)).await;
                    if !matches!(wrote, Ok(Ok(()))) {
                        return;
                    }
                    tracing::debug!(pod = %pod, sandbox = %target.sandbox_id, ?upgrade, "port-forward session");
                    portforward::serve(stream, upgrade, target, config.streaming_idle_timeout)
                        .await;
                }
            }
        }
        ["stats", "summary"] | ["stats", "summary", ""] => {
            let only_cpu_and_memory = query_flag(&request, "only_cpu_and_memory");
            let summary = read_stats(&request, services, only_cpu_and_memory).await;
            let response = summary.map_or_else(
                |response| response,
                |summary| match summary {
                    Ok(summary) => super::routes::json(200, &summary),
                    Err(err) => {
                        tracing::error!(%err, "Failed to get system container stats");
                        Response::text(500, format!("Internal Error: {err}\n"))
                    }
                },
            );
            respond(&mut writer, response).await;
        }
        ["metrics", "resource"] => {
            let summary = read_stats(&request, services, true).await;
            let response = summary.map_or_else(
                |response| response,
                |summary| {
                    let text = stats::resource_metrics(summary.as_ref().map_err(String::as_str));
                    Response::new(200, super::routes::METRICS_CONTENT_TYPE, text)
                },
            );
            respond(&mut writer, response).await;
        }
        ["metrics", "probes"] => {
            let response = get_only(&request, || {
                let text = services.probes.render();
                Response::new(200, super::routes::METRICS_CONTENT_TYPE, text)
            });
            respond(&mut writer, response).await;
        }
        ["runningpods", ""] | ["runningpods"] => {
            let response = get_only(&request, || {
                super::routes::pod_list(running_pods(services.view.pods()))
            });
            respond(&mut writer, response).await;
        }
        ["configz"] if request.method == "GET" => {
            let body = serde_json::json!({ "kubeletconfig": config.configz });
            let response = Response::new(200, http::JSON, body.to_string());
            respond(&mut writer, response).await;
        }
        _ => {
            let response = super::routes::route(&request, &*services.view, &services.metrics);
            respond(&mut writer, response).await;
        }
    }
}

/// `answer()` for GET (HEAD too, answered without a body by the writer), else 405.
/// The StatsProvider's Summary (only CPU and memory if `cpu_and_memory_only`), read on a
/// blocking thread (it walks file systems); `Err` is the answer to a method other than GET.
async fn read_stats(
    request: &Request,
    services: &Services,
    cpu_and_memory_only: bool,
) -> Result<Result<stats::Summary, String>, Response> {
    if request.method != "GET" && request.method != "HEAD" {
        return Err(get_only(request, || Response::text(200, "")));
    }
    let provider = services.stats.clone();
    let read = tokio::task::spawn_blocking(move || {
        if cpu_and_memory_only {
            provider.cpu_and_memory()
        } else {
            provider.summary()
        }
    });
    Ok(read
        .await
        .unwrap_or_else(|err| Err(format!("reading the stats: {err}"))))
}

/// Whether the query sets `name=true` (kubelet's `QueryParameter(name) == "true"`).
fn query_flag(request: &Request, name: &str) -> bool {
    request
        .query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .any(|pair| pair.split_once('=') == Some((name, "true")))
}

fn get_only(request: &Request, answer: impl FnOnce() -> Response) -> Response {
    if request.method == "GET" || request.method == "HEAD" {
        answer()
    } else {
        let mut resp = Response::text(405, "method not allowed\n");
        resp.allow = Some("GET, HEAD");
        resp
    }
}

/// kubelet's `/runningpods/`: the runtime's pods as bare `v1.Pod`s (uid, name, namespace and
/// the running containers' names and images), here those with a running container.
fn running_pods(pods: Vec<Pod>) -> Vec<Pod> {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    pods.into_iter()
        .filter_map(|pod| {
            let containers: Vec<Container> = pod
                .status?
                .container_statuses
                .into_iter()
                .flatten()
                .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                .map(|c| Container {
                    name: c.name,
                    image: Some(c.image),
                    ..Container::default()
                })
                .collect();
            (!containers.is_empty()).then(|| Pod {
                metadata: ObjectMeta {
                    name: pod.metadata.name,
                    namespace: pod.metadata.namespace,
                    uid: pod.metadata.uid,
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers,
                    ..PodSpec::default()
                }),
                status: None,
            })
        })
        .collect()
}

async fn respond<W: AsyncWrite + Unpin>(writer: &mut W, response: Response) {
    let write = async {
        writer.write_all(&response.to_bytes(false)).await?;
        writer.shutdown().await
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write).await;
}

async fn authenticate(
    cert_user: Option<User>,
    request: &Request,
    services: &Services,
) -> Option<User> {
    if cert_user.is_some() {
        return cert_user;
    }
    let header = request.header("authorization")?;
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    match services.authenticator.authenticate(token).await {
        Ok(user) => user,
        Err(err) => {
            tracing::warn!(err = %err, "token review failed");
            None
        }
    }
}

/// `Ok` if any of the path's subresources is allowed; else the 403 (or 500) to send.
async fn authorize(
    user: &User,
    request: &Request,
    config: &KubeletApiConfig,
    services: &Services,
) -> Result<(), Response> {
    let attrs = auth::attributes(&request.method, &request.path);
    for subresource in &attrs.subresources {
        match services
            .authorizer
            .allowed(user, attrs.verb, subresource, &request.path)
            .await
        {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(err = %err, "subject access review failed");
                return Err(Response::text(500, "Authorization error\n"));
            }
        }
    }
    // kubelet's message.
    Err(Response::text(
        403,
        format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource(s)={:?}, node={})\n",
            user.name, attrs.verb, attrs.subresources, config.node_name
        ),
    ))
}

type LogTarget = (PathBuf, logs::LogOptions, Box<dyn Fn() -> bool + Send>);

fn container_logs(
    namespace: &str,
    pod_name: &str,
    container: &str,
    request: &Request,
    config: &KubeletApiConfig,
    services: &Services,
) -> Result<LogTarget, Response> {
    if request.method != "GET" {
        return Err(Response::text(405, "method not allowed\n"));
    }
    let opts = logs::LogOptions::parse(request.query.as_deref(), chrono::Utc::now())
        .map_err(|e| Response::text(400, format!("{e}\n")))?;
    if ![namespace, pod_name, container]
        .iter()
        .all(|n| logs::is_safe_name(n))
    {
        return Err(Response::text(
            400,
            "invalid namespace, pod or container name\n",
        ));
    }
    let pod = services
        .view
        .pod(namespace, pod_name)
        .ok_or_else(|| Response::text(404, format!("pod {namespace}/{pod_name} not found\n")))?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let known = pod.spec.as_ref().is_some_and(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| &c.name)
            .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name))
            .any(|name| name == container)
    });
    if !known || !logs::is_safe_name(&uid) {
        return Err(Response::text(
            404,
            format!("container {container:?} not found in pod {pod_name:?}\n"),
        ));
    }
    let dir = config
        .pod_log_dir
        .join(format!("{namespace}_{pod_name}_{uid}"))
        .join(container);
    let path = logs::instance_file(&dir, opts.previous).ok_or_else(|| {
        let which = if opts.previous {
            "previous terminated"
        } else {
            ""
        };
        Response::text(
            400,
            format!("{which} container {container:?} in pod {pod_name:?} has no logs yet\n"),
        )
    })?;
    let (view, ns, name, c, file) = (
        services.view.clone(),
        namespace.to_owned(),
        pod_name.to_owned(),
        container.to_owned(),
        path.clone(),
    );
    let running = move || {
        container_running(&*view, &ns, &name, &c) && !logs::newer_instance_started(&dir, &file)
    };
    Ok((path, opts, Box::new(running)))
}

/// How an exec's streams travel.
#[derive(Debug, Clone, Copy)]
enum ExecTransport {
    WebSocket(exec::Protocol),
    Spdy(exec_spdy::Version),
}

type ExecTarget = (ContainerId, exec::ExecOptions, Vec<u8>, ExecTransport);

/// The running container an exec (or attach) goes to, its options and the upgrade answer;
/// else the error response (kubelet's codes: 400 bad request, 404 unknown pod or container).
fn exec_target(
    namespace: &str,
    pod_name: &str,
    container: &str,
    request: &Request,
    services: &Services,
    attach: bool,
) -> Result<ExecTarget, Response> {
    if request.method != "GET" && request.method != "POST" {
        return Err(Response::text(405, "method not allowed\n"));
    }
    let query = request.query.as_deref();
    let opts = if attach {
        exec::ExecOptions::parse_attach(query)
    } else {
        exec::ExecOptions::parse(query)
    }
    .map_err(|e| Response::text(400, format!("{e}\n")))?;
    let pod = services
        .view
        .pod(namespace, pod_name)
        .ok_or_else(|| Response::text(404, "pod does not exist\n"))?;
    let id = pod
        .status
        .map(all_container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == container)
        .and_then(|c| c.container_id)
        .and_then(|uri| {
            let raw = uri.strip_prefix(crate::status::CONTAINER_ID_SCHEME)?;
            ContainerId::parse(raw.strip_prefix("://")?)
        })
        .ok_or_else(|| {
            Response::text(
                404,
                format!("container {container:?} not found in pod {pod_name:?}\n"),
            )
        })?;
    if exec_spdy::is_spdy(request) {
        let (head, version) = exec_spdy::upgrade_response(request)?;
        return Ok((id, opts, head, ExecTransport::Spdy(version)));
    }
    let (head, protocol) =
        exec::upgrade_response(request).map_err(|e| Response::text(400, format!("{e}\n")))?;
    Ok((id, opts, head, ExecTransport::WebSocket(protocol)))
}

/// The sandbox a port-forward goes to and the upgrade answer; else kubelet's error
/// response (404 unknown pod or uid, 500 no sandbox, the upgrade's own refusals).
async fn port_forward_target(
    namespace: &str,
    pod_name: &str,
    uid: Option<&str>,
    request: &Request,
    services: &Services,
) -> Result<(portforward::Target, Vec<u8>, portforward::Upgrade), Response> {
    let pod = services
        .view
        .pod(namespace, pod_name)
        .ok_or_else(|| Response::text(404, "pod does not exist\n"))?;
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    if uid.is_some_and(|uid| !uid.is_empty() && uid != pod_uid) {
        return Err(Response::text(404, "pod not found\n"));
    }
    let (head, upgrade) = portforward::upgrade_response(request)?;
    let no_sandbox = || {
        Response::text(
            500,
            format!("failed to find sandboxID for pod {pod_name}_{namespace}({pod_uid})\n"),
        )
    };
    let status = services
        .runtime
        .pod_status(&pod_uid)
        .await
        .map_err(|_| no_sandbox())?;
    let sandbox = status
        .sandboxes
        .into_iter()
        .filter(|s| s.state == ironlet_runtime::types::SandboxState::Ready)
        .max_by_key(|s| s.created_at)
        .ok_or_else(no_sandbox)?;
    let target = portforward::Target {
        sandbox_id: sandbox.id.to_string(),
        netns: sandbox.netns_path,
    };
    Ok((target, head, upgrade))
}

/// Asked by a log follower at each wake-up: copies the one pod's status, not every pod.
fn container_running(view: &dyn PodsView, namespace: &str, pod: &str, container: &str) -> bool {
    view.pod_status(namespace, pod)
        .map(|s| {
            all_container_statuses(s)
                .any(|c| c.name == container && c.state.is_some_and(|st| st.running.is_some()))
        })
        .unwrap_or(false)
}

/// The statuses of the regular, init (sidecars among them) and ephemeral containers, as
/// kubelet looks a container up by name for logs and exec.
fn all_container_statuses(status: PodStatus) -> impl Iterator<Item = ContainerStatus> {
    status
        .container_statuses
        .into_iter()
        .flatten()
        .chain(status.init_container_statuses.into_iter().flatten())
        .chain(status.ephemeral_container_statuses.into_iter().flatten())
}

/// The log stream's side of a connection: the head goes out with the first bytes.
struct ConnectionSink<S> {
    reader: ReadHalf<S>,
    writer: WriteHalf<S>,
    started: bool,
}

const STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n";

#[async_trait::async_trait]
impl<S: AsyncRead + AsyncWrite + Send + Unpin> logs::Sink for ConnectionSink<S> {
    async fn write(&mut self, bytes: &[u8]) -> bool {
        let write = async {
            if !self.started {
                self.writer.write_all(STREAM_HEAD).await?;
                self.started = true;
            }
            self.writer.write_all(bytes).await?;
            self.writer.flush().await
        };
        matches!(tokio::time::timeout(WRITE_TIMEOUT, write).await, Ok(Ok(())))
    }

    async fn closed(&mut self) {
        let mut buf = [0u8; 512];
        loop {
            match self.reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, states: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                          "labels": { "app": "x" } },
            "spec": { "containers": [{ "name": "a", "image": "busybox" }, { "name": "b", "image": "busybox" }] },
            "status": { "phase": "Running", "containerStatuses": states },
        }))
        .unwrap()
    }

    fn status(name: &str, state: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "name": name, "image": "docker.io/library/busybox:latest", "imageID": "",
            "ready": false, "restartCount": 0, "state": state,
        })
    }

    /// A view that answers one pod by name and counts how often every pod was listed.
    struct OnePodView {
        pod: Pod,
        listed: std::sync::atomic::AtomicUsize,
    }

    impl PodsView for OnePodView {
        fn pods(&self) -> Vec<Pod> {
            self.listed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            vec![self.pod.clone()]
        }
        fn pod_status(&self, namespace: &str, name: &str) -> Option<PodStatus> {
            crate::server::pod_is_named(&self.pod, namespace, name)
                .then(|| self.pod.status.clone())
                .flatten()
        }
        fn health(&self) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_log_follower_looks_up_its_container_without_listing_every_pod() {
        let running = serde_json::json!({ "running": { "startedAt": "2026-01-01T00:00:00Z" } });
        let exited = serde_json::json!({ "terminated": { "exitCode": 0 } });
        let view = OnePodView {
            pod: pod(
                "up",
                serde_json::json!([status("a", running), status("b", exited)]),
            ),
            listed: 0.into(),
        };
        assert!(container_running(&view, "ns", "up", "a"));
        assert!(!container_running(&view, "ns", "up", "b"));
        assert!(!container_running(&view, "ns", "up", "c"));
        assert!(!container_running(&view, "other", "up", "a"));
        assert!(!container_running(&view, "ns", "down", "a"));
        // Asked several times a second by every `logs -f`: copying every pod each time was
        // most of the agent's heap churn while 10 followers streamed (100 pods).
        assert_eq!(
            view.listed.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "container_running listed every pod"
        );
    }

    #[test]
    fn runningpods_lists_bare_pods_with_their_running_containers_only() {
        let running = serde_json::json!({ "running": { "startedAt": "2026-01-01T00:00:00Z" } });
        let exited = serde_json::json!({ "terminated": { "exitCode": 0 } });
        let pods = vec![
            pod(
                "up",
                serde_json::json!([status("a", running.clone()), status("b", exited.clone())]),
            ),
            pod(
                "done",
                serde_json::json!([status("a", exited.clone()), status("b", exited)]),
            ),
            Pod::default(),
        ];
        let listed = running_pods(pods);
        assert_eq!(listed.len(), 1);
        let up = &listed[0];
        assert_eq!(up.metadata.name.as_deref(), Some("up"));
        assert_eq!(up.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(up.metadata.uid.as_deref(), Some("uid-up"));
        assert!(up.metadata.labels.is_none() && up.status.is_none());
        let containers = &up.spec.as_ref().unwrap().containers;
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0].name, "a");
        assert_eq!(
            containers[0].image.as_deref(),
            Some("docker.io/library/busybox:latest")
        );
    }
}

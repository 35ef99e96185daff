//! [`Action`]: what a probe or a lifecycle hook does, converted and validated from the API's
//! `Probe` / `LifecycleHandler` (exactly one of exec, httpGet, tcpSocket, grpc, sleep).
//!
//! Guarantees: a converted action has a non-empty exec command, ports in 1..=65535 or a
//! valid IANA service name, and an httpGet path, host and headers free of characters that
//! could break the request line (no request smuggling through a manifest). A named port is
//! resolved later, against the container's ports (see [`PortRef::resolve`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerPort, ExecAction, GRPCAction, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One probe or hook action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run a command in the container; exit code 0 is success.
    Exec { command: Vec<String> },
    /// An HTTP GET; a status in 200..400 is success.
    HttpGet(HttpGet),
    /// A TCP connect; connecting is success.
    TcpSocket { host: Option<String>, port: PortRef },
    /// A gRPC health check (`grpc.health.v1.Health/Check` for `service`).
    Grpc { port: u16, service: Option<String> },
    /// Lifecycle hooks only: sleep, then succeed.
    Sleep(Duration),
}

/// An HTTP GET action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    pub scheme: Scheme,
    /// `None`: the pod's address (see [`ProbeNetwork`](super::ProbeNetwork)).
    pub host: Option<String>,
    pub port: PortRef,
    /// Starts with `/`; may carry a query string.
    pub path: String,
    /// In the order given; a `Host` header replaces the default one.
    pub headers: Vec<(String, String)>,
}

/// `HTTP` (the default) or `HTTPS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A port by number or by the name of one of the container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

impl PortRef {
    /// The port number, looking a name up in the container's ports (kubelet's
    /// `findPortByName`: the first port with that name, whatever its protocol).
    pub fn resolve(&self, ports: &[ContainerPort]) -> Result<u16, ActionError> {
        match self {
            Self::Number(n) => Ok(*n),
            Self::Name(name) => {
                let port = ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .ok_or_else(|| ActionError::UnknownPortName(name.clone()))?;
                port_number(i64::from(port.container_port))
            }
        }
    }

    fn from_api(port: &IntOrString) -> Result<Self, ActionError> {
        match port {
            IntOrString::Int(n) => port_number(i64::from(*n)).map(Self::Number),
            IntOrString::String(s) => match s.parse::<i64>() {
                // The API accepts "8080" as a string; kubelet treats it as the number.
                Ok(n) => port_number(n).map(Self::Number),
                Err(_) if is_iana_svc_name(s) => Ok(Self::Name(s.clone())),
                Err(_) => Err(ActionError::InvalidPortName(s.clone())),
            },
        }
    }
}

/// Why a `Probe` or `LifecycleHandler` cannot become an [`Action`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("no action is set")]
    NoAction,
    #[error("more than one action is set: {0:?}")]
    MultipleActions(Vec<&'static str>),
    #[error("exec has an empty command")]
    EmptyCommand,
    #[error("port {0} is outside 1-65535")]
    PortOutOfRange(i64),
    #[error("port name {0:?} is not a valid IANA service name")]
    InvalidPortName(String),
    #[error("the container has no port named {0:?}")]
    UnknownPortName(String),
    #[error("unknown scheme {0:?}: want HTTP or HTTPS")]
    UnknownScheme(String),
    #[error("httpGet path {0:?} contains whitespace or control characters")]
    InvalidPath(String),
    #[error("host {0:?} contains whitespace, control characters or '/'")]
    InvalidHost(String),
    #[error("HTTP header {name:?} has an invalid name or value")]
    InvalidHeader { name: String },
    #[error("tcpSocket is not supported as a lifecycle handler")]
    TcpSocketHook,
    #[error("sleep of {0} seconds is negative")]
    NegativeSleep(i64),
}

impl Action {
    /// The action of a probe: exactly one of exec, httpGet, tcpSocket, grpc.
    pub fn from_probe(probe: &Probe) -> Result<Self, ActionError> {
        let set: Vec<&'static str> = [
            ("exec", probe.exec.is_some()),
            ("httpGet", probe.http_get.is_some()),
            ("tcpSocket", probe.tcp_socket.is_some()),
            ("grpc", probe.grpc.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, is_set)| is_set.then_some(name))
        .collect();
        if set.len() > 1 {
            return Err(ActionError::MultipleActions(set));
        }
        if let Some(exec) = &probe.exec {
            return exec_action(exec);
        }
        if let Some(get) = &probe.http_get {
            return http_get_action(get);
        }
        if let Some(tcp) = &probe.tcp_socket {
            return tcp_socket_action(tcp);
        }
        if let Some(grpc) = &probe.grpc {
            return grpc_action(grpc);
        }
        Err(ActionError::NoAction)
    }

    /// The action of a postStart or preStop hook: exactly one of exec, httpGet, sleep
    /// (tcpSocket is accepted by the API for compatibility but never works, as in kubelet).
    pub fn from_lifecycle_handler(handler: &LifecycleHandler) -> Result<Self, ActionError> {
        if handler.tcp_socket.is_some() {
            return Err(ActionError::TcpSocketHook);
        }
        let set: Vec<&'static str> = [
            ("exec", handler.exec.is_some()),
            ("httpGet", handler.http_get.is_some()),
            ("sleep", handler.sleep.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, is_set)| is_set.then_some(name))
        .collect();
        if set.len() > 1 {
            return Err(ActionError::MultipleActions(set));
        }
        if let Some(exec) = &handler.exec {
            return exec_action(exec);
        }
        if let Some(get) = &handler.http_get {
            return http_get_action(get);
        }
        if let Some(sleep) = &handler.sleep {
            let secs = u64::try_from(sleep.seconds)
                .map_err(|_| ActionError::NegativeSleep(sleep.seconds))?;
            return Ok(Self::Sleep(Duration::from_secs(secs)));
        }
        Err(ActionError::NoAction)
    }
}

fn exec_action(exec: &ExecAction) -> Result<Action, ActionError> {
    let command = exec.command.clone().unwrap_or_default();
    if command.is_empty() {
        return Err(ActionError::EmptyCommand);
    }
    Ok(Action::Exec { command })
}

fn http_get_action(get: &HTTPGetAction) -> Result<Action, ActionError> {
    let scheme = match get.scheme.as_deref() {
        None | Some("") => Scheme::Http,
        Some(s) if s.eq_ignore_ascii_case("http") => Scheme::Http,
        Some(s) if s.eq_ignore_ascii_case("https") => Scheme::Https,
        Some(other) => return Err(ActionError::UnknownScheme(other.to_owned())),
    };
    let path = match get.path.as_deref() {
        None | Some("") => "/".to_owned(),
        Some(p) if p.starts_with('/') => p.to_owned(),
        Some(p) => format!("/{p}"),
    };
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ActionError::InvalidPath(path));
    }
    let headers = get
        .http_headers
        .iter()
        .flatten()
        .map(|h| {
            let name_ok = !h.name.is_empty() && h.name.bytes().all(is_token_byte);
            let value_ok = !h.value.chars().any(|c| c == '\r' || c == '\n' || c == '\0');
            if name_ok && value_ok {
                Ok((h.name.clone(), h.value.clone()))
            } else {
                Err(ActionError::InvalidHeader {
                    name: h.name.clone(),
                })
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Action::HttpGet(HttpGet {
        scheme,
        host: host(get.host.as_deref())?,
        port: PortRef::from_api(&get.port)?,
        path,
        headers,
    }))
}

fn tcp_socket_action(tcp: &TCPSocketAction) -> Result<Action, ActionError> {
    Ok(Action::TcpSocket {
        host: host(tcp.host.as_deref())?,
        port: PortRef::from_api(&tcp.port)?,
    })
}

fn grpc_action(grpc: &GRPCAction) -> Result<Action, ActionError> {
    Ok(Action::Grpc {
        port: port_number(i64::from(grpc.port))?,
        service: grpc.service.clone(),
    })
}

/// An empty host means "the pod's address", as in the API.
fn host(host: Option<&str>) -> Result<Option<String>, ActionError> {
    match host {
        None | Some("") => Ok(None),
        Some(h)
            if h.chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '/') =>
        {
            Err(ActionError::InvalidHost(h.to_owned()))
        }
        Some(h) => Ok(Some(h.to_owned())),
    }
}

fn port_number(n: i64) -> Result<u16, ActionError> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(ActionError::PortOutOfRange(n))
}

/// RFC 6335 service names: 1-15 of `[a-z0-9-]`, at least one letter, no leading, trailing
/// or doubled hyphen.
fn is_iana_svc_name(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HTTPHeader, SleepAction};

    fn http_probe(get: HTTPGetAction) -> Probe {
        Probe {
            http_get: Some(get),
            ..Probe::default()
        }
    }

    #[test]
    fn an_http_get_defaults_to_http_on_slash_and_keeps_headers() {
        let action = Action::from_probe(&http_probe(HTTPGetAction {
            port: IntOrString::Int(8080),
            http_headers: Some(vec![HTTPHeader {
                name: "X-Probe".into(),
                value: "yes".into(),
            }]),
            ..HTTPGetAction::default()
        }));
        assert_eq!(
            action,
            Ok(Action::HttpGet(HttpGet {
                scheme: Scheme::Http,
                host: None,
                port: PortRef::Number(8080),
                path: "/".into(),
                headers: vec![("X-Probe".into(), "yes".into())],
            }))
        );
    }

    #[test]
    fn a_path_without_a_leading_slash_gets_one_and_query_strings_survive() {
        let Ok(Action::HttpGet(get)) = Action::from_probe(&http_probe(HTTPGetAction {
            port: IntOrString::Int(80),
            path: Some("healthz?full=1".into()),
            scheme: Some("HTTPS".into()),
            ..HTTPGetAction::default()
        })) else {
            panic!("not an httpGet");
        };
        assert_eq!(get.path, "/healthz?full=1");
        assert_eq!(get.scheme, Scheme::Https);
    }

    #[test]
    fn a_header_or_path_that_could_split_the_request_is_rejected() {
        let bad_header = http_probe(HTTPGetAction {
            port: IntOrString::Int(80),
            http_headers: Some(vec![HTTPHeader {
                name: "X".into(),
                value: "a\r\nEvil: 1".into(),
            }]),
            ..HTTPGetAction::default()
        });
        assert_eq!(
            Action::from_probe(&bad_header),
            Err(ActionError::InvalidHeader { name: "X".into() })
        );
        let bad_path = http_probe(HTTPGetAction {
            port: IntOrString::Int(80),
            path: Some("/a HTTP/1.0\r\n".into()),
            ..HTTPGetAction::default()
        });
        assert!(matches!(
            Action::from_probe(&bad_path),
            Err(ActionError::InvalidPath(_))
        ));
    }

    #[test]
    fn ports_are_numbers_in_range_or_service_names() {
        let port = |p| PortRef::from_api(&p);
        assert_eq!(
            port(IntOrString::Int(0)),
            Err(ActionError::PortOutOfRange(0))
        );
        assert_eq!(
            port(IntOrString::Int(65536)),
            Err(ActionError::PortOutOfRange(65536))
        );
        assert_eq!(
            port(IntOrString::String("8080".into())),
            Ok(PortRef::Number(8080))
        );
        assert_eq!(
            port(IntOrString::String("http-alt".into())),
            Ok(PortRef::Name("http-alt".into()))
        );
        for bad in ["HTTP", "-web", "web-", "a--b", "1234-5", "sixteen-chars-xx"] {
            assert_eq!(
                port(IntOrString::String(bad.into())),
                Err(ActionError::InvalidPortName(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_named_port_resolves_against_the_container_ports() {
        let ports = vec![ContainerPort {
            name: Some("web".into()),
            container_port: 8080,
            ..ContainerPort::default()
        }];
        assert_eq!(PortRef::Name("web".into()).resolve(&ports), Ok(8080));
        assert_eq!(
            PortRef::Name("admin".into()).resolve(&ports),
            Err(ActionError::UnknownPortName("admin".into()))
        );
    }

    #[test]
    fn a_probe_needs_exactly_one_action() {
        assert_eq!(
            Action::from_probe(&Probe::default()),
            Err(ActionError::NoAction)
        );
        let two = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(1),
                host: None,
            }),
            ..Probe::default()
        };
        assert_eq!(
            Action::from_probe(&two),
            Err(ActionError::MultipleActions(vec!["exec", "tcpSocket"]))
        );
        let empty = Probe {
            exec: Some(ExecAction { command: None }),
            ..Probe::default()
        };
        assert_eq!(Action::from_probe(&empty), Err(ActionError::EmptyCommand));
    }

    #[test]
    fn hooks_accept_sleep_and_refuse_tcp_socket() {
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 2 }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            Action::from_lifecycle_handler(&sleep),
            Ok(Action::Sleep(Duration::from_secs(2)))
        );
        let tcp = LifecycleHandler {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                host: None,
            }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            Action::from_lifecycle_handler(&tcp),
            Err(ActionError::TcpSocketHook)
        );
        let negative = LifecycleHandler {
            sleep: Some(SleepAction { seconds: -1 }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            Action::from_lifecycle_handler(&negative),
            Err(ActionError::NegativeSleep(-1))
        );
    }
}

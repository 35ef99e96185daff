//! [`run_handler`]: runs one [`Action`] once against a container, for probes and for
//! postStart/preStop hooks alike.
//!
//! Guarantees: the call returns within `timeout` plus a small margin for an exec (the
//! runtime kills an exec'd command at `timeout`; the margin covers the runtime's own
//! answer). An action that timed out is a [`ProbeOutcome::Failure`] whose message says so.

use std::time::Duration;

use ironlet_runtime::{Runtime, RuntimeError};

use super::action::Action;
use super::grpc::grpc_check;
use super::http::{http_get, HttpUse};
use super::{net, ProbeOutcome, ProbeTarget};

/// How long past its timeout an exec may take before we stop waiting for the runtime.
const EXEC_MARGIN: Duration = Duration::from_secs(1);
/// kubelet keeps at most this much of a probe's output as its message.
const MAX_MESSAGE: usize = 10 * 1024;

/// Runs `action` once against `target`.
///
/// - exec: `exit 0` is success, another exit code a failure whose message is the command's
///   output, as kubelet's exec prober (`Readiness probe failed: <output>`).
/// - httpGet: HTTP or HTTPS, same-host redirects followed; see the `http` module.
/// - tcpSocket: connecting is success.
/// - grpc: `grpc.health.v1.Health/Check` says `SERVING`; see the `grpc` module.
/// - sleep (hooks): sleeps, cut short by `timeout` (a failure then).
pub async fn run_handler(
    runtime: &dyn Runtime,
    target: &ProbeTarget,
    action: &Action,
    timeout: Duration,
) -> ProbeOutcome {
    run(runtime, target, action, timeout, HttpUse::Probe).await
}

/// Runs a lifecycle hook's `action` once against `target`: as [`run_handler`], except that
/// an httpGet hook succeeds on any HTTP answer, whatever its status (kubelet's handler
/// runner checks only that the request went through).
pub async fn run_hook(
    runtime: &dyn Runtime,
    target: &ProbeTarget,
    action: &Action,
    timeout: Duration,
) -> ProbeOutcome {
    run(runtime, target, action, timeout, HttpUse::Hook).await
}

async fn run(
    runtime: &dyn Runtime,
    target: &ProbeTarget,
    action: &Action,
    timeout: Duration,
    usage: HttpUse,
) -> ProbeOutcome {
    match action {
        Action::Exec { command } => exec(runtime, target, command, timeout, usage).await,
        Action::HttpGet(get) => http_get(target, get, timeout, usage).await,
        Action::TcpSocket { host, port } => {
            net::tcp_socket(target, host.as_deref(), port, timeout).await
        }
        Action::Grpc { port, service } => {
            grpc_check(target, *port, service.as_deref(), timeout).await
        }
        Action::Sleep(duration) if *duration <= timeout => {
            tokio::time::sleep(*duration).await;
            ProbeOutcome::Success
        }
        Action::Sleep(duration) => {
            tokio::time::sleep(timeout).await;
            ProbeOutcome::Failure(format!(
                "sleep of {duration:?} interrupted after {timeout:?}"
            ))
        }
    }
}

async fn exec(
    runtime: &dyn Runtime,
    target: &ProbeTarget,
    command: &[String],
    timeout: Duration,
    usage: HttpUse,
) -> ProbeOutcome {
    let timed_out =
        || ProbeOutcome::Failure(format!("command {command:?} timed out after {timeout:?}"));
    let run = runtime.exec_sync(&target.container_id, command, Some(timeout));
    match tokio::time::timeout(timeout + EXEC_MARGIN, run).await {
        Err(_) | Ok(Err(RuntimeError::ExecTimeout { .. })) => timed_out(),
        Ok(Err(e)) => ProbeOutcome::Unknown(format!("exec {command:?}: {e}")),
        Ok(Ok(out)) if out.exit_code == 0 => ProbeOutcome::Success,
        Ok(Ok(out)) => {
            let mut output = out.stdout;
            output.extend_from_slice(&out.stderr);
            output.truncate(MAX_MESSAGE);
            let output = String::from_utf8_lossy(&output);
            match usage {
                // A hook's failure event names the command and its exit code too.
                HttpUse::Hook => ProbeOutcome::Failure(format!(
                    "command {command:?} exited with {}: {}",
                    out.exit_code,
                    output.trim_end()
                )),
                HttpUse::Probe => {
                    tracing::debug!(?command, exit_code = out.exit_code, "exec probe failed");
                    ProbeOutcome::Failure(output.into_owned())
                }
            }
        }
    }
}

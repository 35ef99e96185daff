//! Shutdown detection through systemd-logind over D-Bus, as kubelet's
//! `nodeshutdown/systemd` does (zbus on the agent's tokio runtime):
//!
//! 1. read `InhibitDelayMaxUSec` of `org.freedesktop.login1.Manager`; when it is shorter
//!    than the whole shutdown grace period, write `/etc/systemd/logind.conf.d/99-ironlet.conf`
//!    (`[Login] InhibitDelayMaxSec=N`), make logind reload it (SIGHUP through systemd's
//!    `KillUnit`) and read it again: still shorter is an error (kubelet's message);
//! 2. take a "delay" inhibitor lock for `shutdown` (`Inhibit("shutdown", "ironlet", …,
//!    "delay")`): logind then waits for it (up to `InhibitDelayMaxSec`) before shutting down;
//! 3. on `PrepareForShutdown(true)` report [`ShutdownEvent::Start`] and release the lock once
//!    the pods are stopped; on `PrepareForShutdown(false)` (cancelled) report
//!    [`ShutdownEvent::Cancel`] and take the lock again.
//!
//! Used only where systemd is PID 1 ([`systemd_booted`]: `/run/systemd/system` exists, as
//! `sd_booted()` checks); elsewhere the supervisor's SIGPWR is the only trigger. The
//! decisions are the pure functions here, unit-tested; the D-Bus calls need a running
//! logind, which the test machines (no systemd as PID 1) do not have.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;

use super::{NodeShutdown, ShutdownEvent};

/// Where the drop-in goes (kubelet: `99-kubelet.conf` in the same directory).
pub const DROP_IN_DIR: &str = "/etc/systemd/logind.conf.d";
pub const DROP_IN_FILE: &str = "99-ironlet.conf";

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// The reason shown by `systemd-inhibit --list`.
const WHY: &str = "ironlet needs time to stop pods gracefully";

/// Why logind cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("D-Bus: {0}")]
    Bus(#[from] zbus::Error),
    #[error("writing {path}: {source}")]
    DropIn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node shutdown manager was unable to update logind InhibitDelayMaxSec to {requested:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({current:?}) is less than requested ShutdownGracePeriod")]
    DelayTooShort {
        requested: Duration,
        current: Duration,
    },
    #[error("logind's PrepareForShutdown signal stream ended")]
    StreamEnded,
}

/// How shutdowns are detected on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// logind's inhibitor lock and `PrepareForShutdown` (and SIGPWR).
    Logind,
    /// SIGPWR to the supervisor only.
    Sigpwr,
}

/// systemd is PID 1 when `<root>/run/systemd/system` is a directory (`sd_booted()`).
pub fn systemd_booted(root: &Path) -> bool {
    root.join("run/systemd/system").is_dir()
}

/// logind where systemd booted the machine and graceful shutdown is on; SIGPWR otherwise.
pub fn detection(enabled: bool, systemd_booted: bool) -> Detection {
    if enabled && systemd_booted {
        Detection::Logind
    } else {
        Detection::Sigpwr
    }
}

/// Whether logind's `InhibitDelayMaxSec` must be raised for `requested`.
pub fn needs_raise(current: Duration, requested: Duration) -> bool {
    current < requested
}

/// The drop-in that raises `InhibitDelayMaxSec` to `requested` (whole seconds, rounded up).
pub fn drop_in(requested: Duration) -> String {
    let seconds = requested.as_secs() + u64::from(requested.subsec_nanos() > 0);
    format!("# ironlet logind override\n[Login]\nInhibitDelayMaxSec={seconds}\n")
}

/// What a `PrepareForShutdown(start)` means for the shutdown manager and the lock.
pub fn on_prepare_for_shutdown(start: bool) -> (ShutdownEvent, LockAction) {
    if start {
        (ShutdownEvent::Start, LockAction::ReleaseWhenDone)
    } else {
        (ShutdownEvent::Cancel, LockAction::Reacquire)
    }
}

/// What happens to the inhibitor lock after a `PrepareForShutdown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockAction {
    /// Keep it until the pods are stopped, then close it so the shutdown proceeds.
    ReleaseWhenDone,
    /// The shutdown was cancelled: hold a lock again for the next one.
    Reacquire,
}

async fn proxy<'a>(
    bus: &zbus::Connection,
    destination: &'a str,
    path: &'a str,
    interface: &'a str,
) -> Result<zbus::Proxy<'a>, zbus::Error> {
    zbus::proxy::Builder::new(bus)
        .destination(destination)?
        .path(path)?
        .interface(interface)?
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
}

async fn inhibit_delay(logind: &zbus::Proxy<'_>) -> Result<Duration, zbus::Error> {
    let usec: u64 = logind.get_property("InhibitDelayMaxUSec").await?;
    Ok(Duration::from_micros(usec))
}

async fn inhibit(logind: &zbus::Proxy<'_>) -> Result<zbus::zvariant::OwnedFd, zbus::Error> {
    logind
        .call("Inhibit", &("shutdown", "ironlet", WHY, "delay"))
        .await
}

/// Raises `InhibitDelayMaxSec` to `requested` when it is shorter (kubelet's start-up).
async fn ensure_inhibit_delay(
    bus: &zbus::Connection,
    logind: &zbus::Proxy<'_>,
    requested: Duration,
) -> Result<(), LogindError> {
    let current = inhibit_delay(logind).await?;
    if !needs_raise(current, requested) {
        return Ok(());
    }
    let dir = Path::new(DROP_IN_DIR);
    let path = dir.join(DROP_IN_FILE);
    let write =
        std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, drop_in(requested)));
    write.map_err(|source| LogindError::DropIn {
        path: path.clone(),
        source,
    })?;
    tracing::info!(path = %path.display(), ?current, ?requested, "raising logind's InhibitDelayMaxSec");
    let systemd = proxy(bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER).await?;
    let () = systemd
        .call("KillUnit", &("systemd-logind.service", "all", libc::SIGHUP))
        .await?;
    // logind reloads asynchronously (kubelet waits a second as well).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let current = inhibit_delay(logind).await?;
    if needs_raise(current, requested) {
        return Err(LogindError::DelayTooShort { requested, current });
    }
    Ok(())
}

/// Watches logind until an error: takes the inhibitor lock, reports shutdowns to
/// `shutdown` and releases the lock once its pods are stopped.
pub async fn watch(shutdown: NodeShutdown, requested: Duration) -> Result<(), LogindError> {
    let bus = zbus::Connection::system().await?;
    let logind = proxy(&bus, LOGIND, LOGIND_PATH, LOGIND_MANAGER).await?;
    ensure_inhibit_delay(&bus, &logind, requested).await?;
    let mut signals = logind.receive_signal("PrepareForShutdown").await?;
    let mut lock = Some(inhibit(&logind).await?);
    tracing::info!(
        ?requested,
        "graceful node shutdown: holding a logind delay inhibitor lock"
    );
    let mut done = shutdown.done();
    loop {
        let Some(message) = signals.next().await else {
            return Err(LogindError::StreamEnded);
        };
        let start: bool = match message.body().deserialize() {
            Ok(start) => start,
            Err(err) => {
                tracing::warn!(%err, "malformed PrepareForShutdown signal ignored");
                continue;
            }
        };
        let (event, action) = on_prepare_for_shutdown(start);
        shutdown.send(event);
        match action {
            LockAction::ReleaseWhenDone => {
                let _ = done.wait_for(|d| *d).await;
                lock = None;
                tracing::info!("pods stopped; the logind inhibitor lock is released");
            }
            LockAction::Reacquire => {
                if lock.is_none() {
                    lock = Some(inhibit(&logind).await?);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logind_is_used_only_where_systemd_booted_and_shutdown_is_on() {
        assert_eq!(detection(true, true), Detection::Logind);
        assert_eq!(detection(true, false), Detection::Sigpwr);
        assert_eq!(detection(false, true), Detection::Sigpwr);
        let dir = tempfile::tempdir().unwrap();
        assert!(!systemd_booted(dir.path()));
        std::fs::create_dir_all(dir.path().join("run/systemd/system")).unwrap();
        assert!(systemd_booted(dir.path()));
    }

    #[test]
    fn the_inhibit_delay_is_raised_only_when_shorter_than_the_grace_period() {
        let s = Duration::from_secs;
        assert!(needs_raise(s(5), s(30)), "logind's default is 5 s");
        assert!(!needs_raise(s(30), s(30)));
        assert!(!needs_raise(s(60), s(30)));
        assert_eq!(
            drop_in(s(30)),
            "# ironlet logind override\n[Login]\nInhibitDelayMaxSec=30\n"
        );
        assert!(drop_in(Duration::from_millis(1500)).contains("InhibitDelayMaxSec=2\n"));
    }

    #[test]
    fn prepare_for_shutdown_starts_or_cancels() {
        assert_eq!(
            on_prepare_for_shutdown(true),
            (ShutdownEvent::Start, LockAction::ReleaseWhenDone)
        );
        assert_eq!(
            on_prepare_for_shutdown(false),
            (ShutdownEvent::Cancel, LockAction::Reacquire)
        );
    }
}

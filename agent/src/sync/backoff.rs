//! CrashLoopBackOff: kubelet's container restart back-off (`flowcontrol.Backoff` as used by
//! `kuberuntime_manager.doBackOff`), with the clock passed in.
//!
//! ```text
//!  exit ─► restart now (first time) ─► exit ─► wait 10s ─► restart ─► exit ─► wait 20s …
//!          … 40s, 80s, 160s, 300s, 300s …        a run of > 10 min (2 × max) resets to 10s
//! ```
//!
//! Each (pod, container name, spec hash) has an entry `{ window, last_update }`:
//! - [`Backoff::next`] records a restart: the window starts at `initial` for a new or
//!   expired entry, else doubles up to `max`; `last_update` becomes `now`.
//! - [`Backoff::is_in_backoff`] says whether a container that finished at `finished_at` must
//!   still wait at `now`: yes while `now - finished_at < window`.
//! - An entry *expires* when the container finished more than `2 × max` after the restart
//!   that recorded it, i.e. it ran (or stayed un-restarted) that long: it is then treated as
//!   absent. [`Backoff::gc`] drops entries not updated for `2 × max`.
//!
//! Keying by the spec hash means an edited container starts without waiting.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;

use super::actions::ContainerStart;

/// kubelet's initial container back-off (`backOffPeriod`).
pub const DEFAULT_INITIAL: Duration = Duration::from_secs(10);
/// kubelet's `MaxContainerBackOff`.
pub const DEFAULT_MAX: Duration = Duration::from_secs(300);
/// The waiting reason of a container in back-off.
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";

/// Identifies a container for back-off: kubelet's `getStableKey`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackoffKey {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub container: String,
    /// [`container_hash`](super::container_hash) of the container's spec.
    pub hash: String,
}

impl BackoffKey {
    /// The key of container `container` (spec hash `hash`) of `pod`.
    #[must_use]
    pub fn new(pod: &Pod, container: &str, hash: &str) -> Self {
        let meta = &pod.metadata;
        Self {
            pod_name: meta.name.clone().unwrap_or_default(),
            pod_namespace: meta.namespace.clone().unwrap_or_default(),
            pod_uid: meta.uid.clone().unwrap_or_default(),
            container: container.to_owned(),
            hash: hash.to_owned(),
        }
    }
}

impl fmt::Display for BackoffKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}_{}_{}_{}_{}",
            self.pod_name, self.pod_namespace, self.pod_uid, self.container, self.hash
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    window: Duration,
    last_update: SystemTime,
}

/// Per-container exponential back-off; see the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<BackoffKey, Entry>,
}

impl Default for Backoff {
    /// kubelet's container back-off: 10 s doubling to 300 s.
    fn default() -> Self {
        Self::new(DEFAULT_INITIAL, DEFAULT_MAX)
    }
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max` (`max` is raised to
    /// `initial` if smaller).
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            entries: HashMap::new(),
        }
    }

    /// The current window of `key` (zero when it has none).
    #[must_use]
    pub fn window(&self, key: &BackoffKey) -> Duration {
        self.entries.get(key).map_or(Duration::ZERO, |e| e.window)
    }

    /// How long a container that finished at `finished_at` must still wait at `now` before
    /// its restart, or `None` if it may restart now.
    #[must_use]
    pub fn is_in_backoff(
        &self,
        key: &BackoffKey,
        finished_at: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if self.expired(entry, finished_at) {
            return None;
        }
        let since = now.duration_since(finished_at).unwrap_or(Duration::ZERO);
        entry
            .window
            .checked_sub(since)
            .filter(|left| !left.is_zero())
    }

    /// Records a restart at `now` of a container that finished at `finished_at`.
    pub fn next(&mut self, key: &BackoffKey, finished_at: SystemTime, now: SystemTime) {
        let window = match self.entries.get(key) {
            Some(entry) if !self.expired(entry, finished_at) => (entry.window * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.clone(),
            Entry {
                window,
                last_update: now,
            },
        );
    }

    /// Forgets `key`.
    pub fn reset(&mut self, key: &BackoffKey) {
        self.entries.remove(key);
    }

    /// Drops entries not updated for more than `2 × max` before `now`.
    pub fn gc(&mut self, now: SystemTime) {
        let horizon = self.max * 2;
        self.entries.retain(|_, e| {
            now.duration_since(e.last_update)
                .map_or(true, |age| age <= horizon)
        });
    }

    /// Number of containers with an entry.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no container has an entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// kubelet `hasExpired`: the event came more than `2 × max` after the last update.
    fn expired(&self, entry: &Entry, event: SystemTime) -> bool {
        event
            .duration_since(entry.last_update)
            .is_ok_and(|d| d > self.max * 2)
    }
}

/// A container held back by its back-off: its waiting state and when to sync again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashLoopBackOff {
    pub container: String,
    /// kubelet's message, e.g. `back-off 20s restarting failed container=web pod=web_default(uid)`.
    pub message: String,
    /// When the back-off ends: the worker should sync the pod again then.
    pub retry_at: SystemTime,
}

impl CrashLoopBackOff {
    /// The waiting reason, [`CRASH_LOOP_BACK_OFF`].
    #[must_use]
    pub fn reason(&self) -> &'static str {
        CRASH_LOOP_BACK_OFF
    }
}

/// The starts of one sync split by back-off.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackoffFiltered {
    /// Start these now, in order.
    pub to_start: Vec<ContainerStart>,
    /// These wait.
    pub waiting: Vec<CrashLoopBackOff>,
}

impl BackoffFiltered {
    /// The earliest end of a back-off, when the pod should be synced again.
    #[must_use]
    pub fn next_resync(&self) -> Option<SystemTime> {
        self.waiting.iter().map(|w| w.retry_at).min()
    }
}

/// Splits `starts` (of pod `pod`) into those that may start at `now` and those in back-off.
/// A container that exited before and may restart is recorded in `backoff` as restarted
/// (kubelet calls `Next` at the same point, before the start is attempted); a container
/// that never exited is never held back.
pub fn filter_backoff(
    pod: &Pod,
    starts: Vec<ContainerStart>,
    backoff: &mut Backoff,
    now: SystemTime,
) -> BackoffFiltered {
    let mut out = BackoffFiltered::default();
    for start in starts {
        let Some(finished_at) = start.last_exit else {
            out.to_start.push(start);
            continue;
        };
        let key = BackoffKey::new(pod, &start.name, &start.hash);
        if let Some(left) = backoff.is_in_backoff(&key, finished_at, now) {
            out.waiting.push(CrashLoopBackOff {
                message: crash_loop_message(backoff.window(&key), &start.name, pod),
                container: start.name,
                retry_at: now + left,
            });
        } else {
            backoff.next(&key, finished_at, now);
            out.to_start.push(start);
        }
    }
    out
}

/// kubelet's back-off error: `back-off 10s restarting failed container=NAME
/// pod=NAME_NAMESPACE(UID)`, the window in Go's duration format.
#[must_use]
pub fn crash_loop_message(window: Duration, container: &str, pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "back-off {} restarting failed container={container} pod={}_{}({})",
        go_duration(window),
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default(),
    )
}

/// A duration as Go's `time.Duration.String` prints it: `10s`, `2m40s`, `5m0s`, `1h0m0s`,
/// `1.5s`, `250ms`.
#[must_use]
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let secs = d.as_secs();
    let (hours, minutes) = (secs / 3600, (secs / 60) % 60);
    let seconds = trim_fraction(
        u128::from(secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos()),
        1_000_000_000,
    );
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// `value / unit` with its fraction, trailing zeros trimmed: `1500, 1000` → `1.5`.
fn trim_fraction(value: u128, unit: u128) -> String {
    let (whole, fraction) = (value / unit, value % unit);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::super::actions::ContainerKind;
    use super::super::fixtures::{pod, t0};
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn key() -> BackoffKey {
        BackoffKey::new(&pod(&[], &["web"]), "web", "abc")
    }

    #[test]
    fn backoff_doubles_from_10s_to_300s_and_resets_after_10min_of_running() {
        let mut backoff = Backoff::default();
        let key = key();
        let mut now = t0();
        let mut windows = Vec::new();
        for _ in 0..8 {
            // The container crashes one second after each restart.
            let finished = now + secs(1);
            now = finished;
            if let Some(left) = backoff.is_in_backoff(&key, finished, now) {
                now += left;
                assert!(backoff.is_in_backoff(&key, finished, now).is_none());
            }
            backoff.next(&key, finished, now);
            windows.push(backoff.window(&key).as_secs());
        }
        assert_eq!(windows, vec![10, 20, 40, 80, 160, 300, 300, 300]);

        // It now runs for 10 min + 1 s after its last restart before exiting: no back-off,
        // and the next window starts over.
        let finished = now + secs(601);
        assert_eq!(backoff.is_in_backoff(&key, finished, finished), None);
        backoff.next(&key, finished, finished);
        assert_eq!(backoff.window(&key), secs(10));
    }

    #[test]
    fn a_run_of_exactly_ten_minutes_does_not_reset_the_backoff() {
        let mut backoff = Backoff::default();
        let key = key();
        backoff.next(&key, t0(), t0());
        backoff.next(&key, t0(), t0());
        let finished = t0() + secs(600);
        assert_eq!(
            backoff.is_in_backoff(&key, finished, finished),
            Some(secs(20))
        );
    }

    #[test]
    fn remaining_backoff_counts_from_the_exit_not_from_now() {
        let mut backoff = Backoff::default();
        let key = key();
        backoff.next(&key, t0(), t0());
        let finished = t0() + secs(2);
        assert_eq!(
            backoff.is_in_backoff(&key, finished, finished + secs(3)),
            Some(secs(7))
        );
        assert_eq!(
            backoff.is_in_backoff(&key, finished, finished + secs(10)),
            None
        );
        assert_eq!(
            backoff.is_in_backoff(&key, finished, finished + secs(60)),
            None
        );
    }

    #[test]
    fn gc_drops_entries_idle_for_twice_the_max() {
        let mut backoff = Backoff::new(secs(1), secs(10));
        let (a, mut b) = (key(), key());
        b.container = "db".into();
        backoff.next(&a, t0(), t0());
        backoff.next(&b, t0(), t0() + secs(15));
        backoff.gc(t0() + secs(20));
        assert_eq!(backoff.len(), 2);
        backoff.gc(t0() + secs(21));
        assert_eq!(backoff.len(), 1);
        assert_eq!(backoff.window(&a), Duration::ZERO);
        assert_eq!(backoff.window(&b), secs(1));
    }

    #[test]
    fn stable_key_and_message_match_kubelet() {
        assert_eq!(key().to_string(), "web_default_uid-1_web_abc");
        assert_eq!(
            crash_loop_message(secs(10), "web", &pod(&[], &["web"])),
            "back-off 10s restarting failed container=web pod=web_default(uid-1)"
        );
    }

    #[test]
    fn durations_print_as_go_does() {
        let cases = [
            (Duration::ZERO, "0s"),
            (secs(10), "10s"),
            (secs(80), "1m20s"),
            (secs(160), "2m40s"),
            (secs(300), "5m0s"),
            (secs(3600), "1h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_nanos(42), "42ns"),
        ];
        for (d, s) in cases {
            assert_eq!(go_duration(d), s);
        }
    }

    fn start(name: &str, last_exit: Option<SystemTime>) -> ContainerStart {
        ContainerStart {
            name: name.into(),
            kind: ContainerKind::Regular,
            index: 0,
            restart_count: 1,
            hash: "abc".into(),
            last_exit,
        }
    }

    #[test]
    fn filter_backoff_holds_crash_looping_containers_and_says_when_to_retry() {
        let pod = pod(&[], &["web", "db", "new"]);
        let mut backoff = Backoff::default();
        let exit = t0();
        // web crashed before and was restarted once: it is in its 10 s window.
        backoff.next(
            &BackoffKey::new(&pod, "web", "abc"),
            exit - secs(5),
            exit - secs(5),
        );
        let now = exit + secs(4);
        let filtered = filter_backoff(
            &pod,
            vec![
                start("web", Some(exit)),
                start("db", Some(exit)),
                start("new", None),
            ],
            &mut backoff,
            now,
        );
        let started: Vec<_> = filtered.to_start.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(started, vec!["db", "new"]);
        assert_eq!(
            filtered.waiting,
            vec![CrashLoopBackOff {
                container: "web".into(),
                message: "back-off 10s restarting failed container=web pod=web_default(uid-1)"
                    .into(),
                retry_at: exit + secs(10),
            }]
        );
        assert_eq!(filtered.waiting[0].reason(), "CrashLoopBackOff");
        assert_eq!(filtered.next_resync(), Some(exit + secs(10)));
        // db's restart was recorded: its next crash waits 10 s.
        let db = BackoffKey::new(&pod, "db", "abc");
        assert_eq!(backoff.window(&db), secs(10));
        assert!(backoff
            .window(&BackoffKey::new(&pod, "new", "abc"))
            .is_zero());
    }

    #[test]
    fn a_changed_spec_hash_starts_without_waiting() {
        let pod = pod(&[], &["web"]);
        let mut backoff = Backoff::default();
        backoff.next(&BackoffKey::new(&pod, "web", "abc"), t0(), t0());
        let mut edited = start("web", Some(t0() + secs(1)));
        edited.hash = "def".into();
        let filtered = filter_backoff(&pod, vec![edited], &mut backoff, t0() + secs(2));
        assert_eq!(filtered.to_start.len(), 1);
        assert!(filtered.waiting.is_empty());
    }
}

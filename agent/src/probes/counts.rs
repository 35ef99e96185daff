//! [`ProbeCounts`]: kubelet's `prober_probe_total` counter, what the kubelet API serves at
//! `/metrics/probes`: every probe a worker ran, by result (`successful`, `failed`,
//! `unknown`), labelled with the container, pod, namespace, pod uid and probe type
//! (`Liveness`, `Readiness`, `Startup`) as kubelet v1.37 labels it
//! (`pkg/kubelet/prober/prober_manager.go`). A worker's series go when the worker stops, as
//! kubelet deletes them. Not kept: `prober_probe_duration_seconds`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{ProbeKind, ProbeOutcome};

/// Whose probes a series counts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Series {
    pub container: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub kind: ProbeKind,
}

/// The counters of every running probe worker.
#[derive(Debug, Default)]
pub struct ProbeCounts {
    /// Series → runs by result: successful, failed, unknown.
    series: Mutex<BTreeMap<Series, [u64; 3]>>,
}

const HELP: &str = "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n# TYPE prober_probe_total counter\n";

impl ProbeCounts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Series, [u64; 3]>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one run of `series`' probe.
    pub(crate) fn record(&self, series: &Series, outcome: &ProbeOutcome) {
        let index = match outcome {
            // kubelet records a warned run (redirect to another host) as a success.
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => 0,
            ProbeOutcome::Failure(_) => 1,
            ProbeOutcome::Unknown(_) => 2,
        };
        let mut all = self.lock();
        let counts = all.entry(series.clone()).or_default();
        counts[index] = counts[index].saturating_add(1);
    }

    /// Forgets a worker's series (it stopped).
    pub(crate) fn forget(&self, series: &Series) {
        self.lock().remove(series);
    }

    /// The Prometheus text of `/metrics/probes` (labels in the Go exposition's order).
    pub fn render(&self) -> String {
        let all = self.lock();
        let mut lines = Vec::new();
        for (s, counts) in all.iter() {
            for (result, count) in ["successful", "failed", "unknown"].iter().zip(counts) {
                lines.push(format!(
                    "prober_probe_total{{container=\"{}\",namespace=\"{}\",pod=\"{}\",pod_uid=\"{}\",probe_type=\"{}\",result=\"{result}\"}} {count}\n",
                    escape(&s.container),
                    escape(&s.namespace),
                    escape(&s.pod),
                    escape(&s.pod_uid),
                    s.kind.as_str(),
                ));
            }
        }
        if lines.is_empty() {
            return String::new();
        }
        lines.sort();
        let mut out = String::from(HELP);
        for line in lines {
            let _ = write!(out, "{line}");
        }
        out
    }
}

/// A label value escaped as the text format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Forgets its series when dropped: held by a worker, so that an aborted or finished worker
/// leaves no series behind.
pub(crate) struct Counted {
    pub counts: Arc<ProbeCounts>,
    pub series: Series,
}

impl Counted {
    pub(crate) fn record(&self, outcome: &ProbeOutcome) {
        self.counts.record(&self.series, outcome);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counts.forget(&self.series);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(pod: &str, kind: ProbeKind) -> Series {
        Series {
            container: "c".into(),
            namespace: "ns".into(),
            pod: pod.into(),
            pod_uid: format!("uid-{pod}"),
            kind,
        }
    }

    #[test]
    fn runs_are_counted_by_result_and_forgotten_with_their_worker() {
        let counts = Arc::new(ProbeCounts::default());
        let worker = Counted {
            counts: counts.clone(),
            series: series("p", ProbeKind::Readiness),
        };
        worker.record(&ProbeOutcome::Success);
        worker.record(&ProbeOutcome::Success);
        worker.record(&ProbeOutcome::Failure("exit 1".into()));
        counts.record(
            &series("a", ProbeKind::Liveness),
            &ProbeOutcome::Unknown("x".into()),
        );
        let text = counts.render();
        assert!(
            text.starts_with("# HELP prober_probe_total [BETA] "),
            "{text}"
        );
        let samples: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            samples,
            [
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"a\",pod_uid=\"uid-a\",probe_type=\"Liveness\",result=\"failed\"} 0",
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"a\",pod_uid=\"uid-a\",probe_type=\"Liveness\",result=\"successful\"} 0",
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"a\",pod_uid=\"uid-a\",probe_type=\"Liveness\",result=\"unknown\"} 1",
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"p\",pod_uid=\"uid-p\",probe_type=\"Readiness\",result=\"failed\"} 1",
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"p\",pod_uid=\"uid-p\",probe_type=\"Readiness\",result=\"successful\"} 2",
                "prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"p\",pod_uid=\"uid-p\",probe_type=\"Readiness\",result=\"unknown\"} 0",
            ]
        );
        drop(worker);
        assert!(!counts.render().contains("pod=\"p\""));
        counts.forget(&series("a", ProbeKind::Liveness));
        assert_eq!(counts.render(), "");
    }
}

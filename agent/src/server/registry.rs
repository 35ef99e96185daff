//! Metric primitives and their Prometheus text exposition (format 0.0.4): [`Counter`],
//! [`Gauge`], [`Histogram`], an unlabelled [`Single`] and a labelled [`Family`].
//!
//! Guarantees:
//! - Updating a value is lock-free (atomics); only finding a labelled child takes a mutex,
//!   held for a short linear scan (label sets here are a handful of values).
//! - A scrape writes `# HELP` and `# TYPE` once per family, label values escaped
//!   (`\\`, `\"`, `\n`), floats as Go prints them (`+Inf`, `-Inf`, `NaN`).
//! - A histogram's `_count` equals its `+Inf` bucket in every scrape (both come from the same
//!   per-bucket counts); `_sum` may lag a concurrent observation by that observation.
//! - A labelled family without children is omitted, as client_golang does.

use std::fmt::Write as _;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Prometheus' default buckets (client_golang `DefBuckets`), seconds.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A metric value type: how to make one and how to write its samples.
pub trait Metric: Send + Sync {
    /// Construction options (the buckets of a histogram).
    type Opts: Copy + Send + Sync;
    /// The `# TYPE` word.
    const KIND: &'static str;
    fn with_opts(opts: Self::Opts) -> Self;
    /// Writes the sample lines; `labels` is the rendered `k="v",…` without braces.
    fn write_samples(&self, name: &str, labels: &str, out: &mut String);
}

/// Something that appears on `/metrics`.
pub trait Collect: Send + Sync {
    fn collect(&self, out: &mut String);
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Counter {
    type Opts = ();
    const KIND: &'static str = "counter";
    fn with_opts((): ()) -> Self {
        Self::default()
    }
    fn write_samples(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, labels, "", &self.get().to_string());
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn add(&self, delta: f64) {
        add_f64(&self.0, delta);
    }
    pub fn inc(&self) {
        self.add(1.0);
    }
    pub fn dec(&self) {
        self.add(-1.0);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl Metric for Gauge {
    type Opts = ();
    const KIND: &'static str = "gauge";
    fn with_opts((): ()) -> Self {
        Self::default()
    }
    fn write_samples(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, labels, "", &fmt_float(self.get()));
    }
}

/// Observations counted into fixed buckets (upper bounds, inclusive), with their sum.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound plus the `+Inf` overflow; not cumulative.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    /// `bounds` must be sorted ascending (checked in debug builds).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "unsorted buckets");
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = if v.is_nan() {
            self.bounds.len()
        } else {
            self.bounds.partition_point(|b| *b < v)
        };
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        add_f64(&self.sum, v);
    }

    /// Observes a duration in seconds.
    pub fn observe_duration(&self, d: std::time::Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }
}

impl Metric for Histogram {
    type Opts = &'static [f64];
    const KIND: &'static str = "histogram";
    fn with_opts(bounds: &'static [f64]) -> Self {
        Self::new(bounds)
    }
    fn write_samples(&self, name: &str, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        let les = self.bounds.iter().copied().chain([f64::INFINITY]);
        for (le, count) in les.zip(self.counts.iter()) {
            cumulative += count.load(Ordering::Relaxed);
            let labels = format!("{labels}{sep}le=\"{}\"", fmt_float(le));
            sample(out, name, &labels, "_bucket", &cumulative.to_string());
        }
        sample(out, name, labels, "_sum", &fmt_float(self.sum()));
        sample(out, name, labels, "_count", &cumulative.to_string());
    }
}

/// An unlabelled metric with its name and help; derefs to the value.
#[derive(Debug)]
pub struct Single<M> {
    name: &'static str,
    help: &'static str,
    value: M,
}

impl<M: Metric> Single<M> {
    pub fn new(name: &'static str, help: &'static str, opts: M::Opts) -> Self {
        Self {
            name,
            help,
            value: M::with_opts(opts),
        }
    }
}

impl<M> Deref for Single<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.value
    }
}

impl<M: Metric> Collect for Single<M> {
    fn collect(&self, out: &mut String) {
        header(out, self.name, self.help, M::KIND);
        self.value.write_samples(self.name, "", out);
    }
}

/// A metric with `N` labels; children are made on first use.
pub struct Family<M: Metric, const N: usize> {
    name: &'static str,
    help: &'static str,
    label_names: [&'static str; N],
    opts: M::Opts,
    children: Mutex<Vec<([String; N], Arc<M>)>>,
}

impl<M: Metric, const N: usize> Family<M, N> {
    pub fn new(
        name: &'static str,
        help: &'static str,
        label_names: [&'static str; N],
        opts: M::Opts,
    ) -> Self {
        Self {
            name,
            help,
            label_names,
            opts,
            children: Mutex::new(Vec::new()),
        }
    }

    /// The child for these label values (in the order of the label names).
    pub fn with(&self, values: [&str; N]) -> Arc<M> {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, m)) = children
            .iter()
            .find(|(k, _)| k.iter().zip(values.iter()).all(|(a, b)| a == b))
        {
            return Arc::clone(m);
        }
        let m = Arc::new(M::with_opts(self.opts));
        children.push((values.map(str::to_owned), Arc::clone(&m)));
        m
    }
}

impl<M: Metric, const N: usize> Collect for Family<M, N> {
    fn collect(&self, out: &mut String) {
        let mut children: Vec<_> = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, m)| (k.clone(), Arc::clone(m)))
            .collect();
        if children.is_empty() {
            return;
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        header(out, self.name, self.help, M::KIND);
        for (values, m) in children {
            let labels: Vec<String> = self
                .label_names
                .iter()
                .zip(values.iter())
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            m.write_samples(self.name, &labels.join(","), out);
        }
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a family.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, suffix: &str, value: &str) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name}{suffix} {value}");
    } else {
        let _ = writeln!(out, "{name}{suffix}{{{labels}}} {value}");
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A float as the exposition format (and Go's strconv) spells it.
pub fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

fn add_f64(cell: &AtomicU64, delta: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        Some((f64::from_bits(bits) + delta).to_bits())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(c: &dyn Collect) -> String {
        let mut out = String::new();
        c.collect(&mut out);
        out
    }

    #[test]
    fn an_unlabelled_gauge_renders_help_type_and_value() {
        let g = Single::<Gauge>::new("kubelet_running_pods", "Number of pods", ());
        g.set(3.0);
        g.inc();
        g.dec();
        g.add(0.5);
        assert_eq!(
            render(&g),
            "# HELP kubelet_running_pods Number of pods\n\
             # TYPE kubelet_running_pods gauge\n\
             kubelet_running_pods 3.5\n"
        );
    }

    #[test]
    fn a_counter_family_renders_children_sorted_with_escaped_labels() {
        let f = Family::<Counter, 2>::new("x_total", "Help with \\ and\nnewline", ["a", "b"], ());
        assert_eq!(render(&f), "", "an empty family is omitted");
        f.with(["z", "1"]).inc();
        f.with(["y", "q\"\\\n"]).add(2);
        f.with(["z", "1"]).add(4);
        assert_eq!(
            render(&f),
            "# HELP x_total Help with \\\\ and\\nnewline\n\
             # TYPE x_total counter\n\
             x_total{a=\"y\",b=\"q\\\"\\\\\\n\"} 2\n\
             x_total{a=\"z\",b=\"1\"} 5\n"
        );
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let h = Single::<Histogram>::new("d_seconds", "D", &[0.5, 1.0, 2.5]);
        for v in [0.1, 0.5, 0.7, 3.0, f64::NAN] {
            h.observe(v);
        }
        let text = render(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[2..],
            [
                "d_seconds_bucket{le=\"0.5\"} 2",
                "d_seconds_bucket{le=\"1\"} 3",
                "d_seconds_bucket{le=\"2.5\"} 3",
                "d_seconds_bucket{le=\"+Inf\"} 5",
                "d_seconds_sum NaN",
                "d_seconds_count 5",
            ]
        );
    }

    #[test]
    fn a_labelled_histogram_puts_le_after_its_labels() {
        let f = Family::<Histogram, 1>::new("w_seconds", "W", ["operation_type"], &[1.0]);
        f.with(["sync"])
            .observe_duration(std::time::Duration::from_millis(1500));
        let text = render(&f);
        assert!(text.contains("w_seconds_bucket{operation_type=\"sync\",le=\"1\"} 0\n"));
        assert!(text.contains("w_seconds_bucket{operation_type=\"sync\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("w_seconds_sum{operation_type=\"sync\"} 1.5\n"));
        assert!(text.contains("w_seconds_count{operation_type=\"sync\"} 1\n"));
    }

    #[test]
    fn floats_are_spelled_as_prometheus_expects() {
        assert_eq!(fmt_float(1.0), "1");
        assert_eq!(fmt_float(0.005), "0.005");
        assert_eq!(fmt_float(f64::INFINITY), "+Inf");
        assert_eq!(fmt_float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(fmt_float(f64::NAN), "NaN");
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = Arc::new(Histogram::new(DEFAULT_BUCKETS));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = Arc::clone(&h);
                std::thread::spawn(move || (0..1000).for_each(|_| h.observe(0.25)))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(h.count(), 4000);
        assert!((h.sum() - 1000.0).abs() < 1e-9);
    }
}

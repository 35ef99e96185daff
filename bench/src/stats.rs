//! Summary statistics the benchmark binaries print: nearest-rank percentiles and
//! milliseconds.

use std::time::Duration;

/// The nearest-rank `p`th percentile of `sorted` (ascending); zero when it is empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

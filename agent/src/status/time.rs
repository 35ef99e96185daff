//! Time conversions for the API status: `SystemTime` to `metav1.Time` in whole seconds (as the
//! API serialises it), and Go's `Duration.String()` for kubelet's back-off messages.

use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// `t` truncated to the second; times outside jiff's range (years beyond ±9999) clamp to it.
pub(crate) fn api_time(t: SystemTime) -> Time {
    let seconds = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Before 1970: round towards the past, as truncation to a second does.
        Err(e) => {
            let d = e.duration();
            let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            -whole - i64::from(d.subsec_nanos() > 0)
        }
    };
    let seconds = seconds.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Go's `time.Duration.String()`: `10s`, `1m20s`, `5m0s`, `1h0m0s`, `1.5s`, `500ms`, `0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        let (unit, div) = match nanos {
            n if n < 1_000 => ("ns", 1),
            n if n < 1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", fraction(nanos, div));
    }
    let secs = d.as_secs();
    let (h, m) = (secs / 3600, (secs / 60) % 60);
    let s = fraction(
        u128::from(secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos()),
        1_000_000_000,
    );
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// `value / div` with the remainder as decimals, trailing zeros trimmed.
fn fraction(value: u128, div: u128) -> String {
    let (whole, rest) = (value / div, value % div);
    if rest == 0 {
        return whole.to_string();
    }
    let width = div.ilog10() as usize;
    let decimals = format!("{rest:0width$}");
    format!("{whole}.{}", decimals.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_times_are_whole_seconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_999);
        assert_eq!(api_time(t).0.as_second(), 1_700_000_000);
        assert_eq!(api_time(t).0.subsec_nanosecond(), 0);
    }

    #[test]
    fn durations_print_as_go_prints_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(80), "1m20s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(1500), "1.5ms"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }
}

//! Go-style durations (`90s`, `1m30s`, `500ms`, `2h`) as kubelet flags and
//! `metav1.Duration` fields take them.

use std::time::Duration;

/// Go-style durations as kubelet flags take them: `90s`, `1m`, `1m30s`, `500ms`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(|| format!("{text:?}: missing unit (ms, s, m, h)"))?;
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?}: bad number {number:?}"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h)")),
        };
        total += Duration::from_secs_f64(seconds);
        rest = next;
    }
    Ok(total)
}

//! Summary statistics the benchmark binaries print: nearest-rank percentiles,
//! milliseconds, and the table of figures per runtime with ironlet's ratios.

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

/// Prints one row per runtime, ironlet's first: the name under `first` (22 wide), then three
/// figures under `columns` (each `width` wide, two decimals), the first being the p50; then
/// `ratio ironlet/NAME (p50): R` for every other runtime.
pub fn print_p50_table(first: &str, columns: [&str; 3], width: usize, rows: &[(&str, [f64; 3])]) {
    print!("{}", p50_table(first, columns, width, rows));
}

fn p50_table(first: &str, columns: [&str; 3], width: usize, rows: &[(&str, [f64; 3])]) -> String {
    let [a, b, c] = columns;
    let mut out = format!("{first:<22} {a:>width$} {b:>width$} {c:>width$}\n");
    for (name, [x, y, z]) in rows {
        out += &format!("{name:<22} {x:>width$.2} {y:>width$.2} {z:>width$.2}\n");
    }
    if let Some((_, [ironlet, ..])) = rows.first() {
        for (name, [p50, ..]) in &rows[1..] {
            out += &format!("ratio ironlet/{name} (p50): {:.2}\n", ironlet / p50);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p50_table_lines_up_its_columns_and_gives_ironlets_ratio_to_each_other_runtime() {
        let rows = [
            ("ironlet (in-process)", [1.5, 2.25, 1.75]),
            ("crun", [3.0, 4.0, 3.5]),
        ];
        assert_eq!(
            p50_table("runtime", ["p50 ms", "p90 ms", "mean ms"], 10, &rows),
            "runtime                    p50 ms     p90 ms    mean ms\n\
             ironlet (in-process)         1.50       2.25       1.75\n\
             crun                         3.00       4.00       3.50\n\
             ratio ironlet/crun (p50): 0.50\n"
        );
        assert_eq!(
            p50_table("command", ["a", "b", "c"], 9, &[]),
            format!("{:<22} {:>9} {:>9} {:>9}\n", "command", "a", "b", "c")
        );
    }
}

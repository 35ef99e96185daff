//! [`Backoff`]: the retry delay of registration and lease renewal (kubelet's lease controller:
//! 100 ms doubling up to 7 s, reset by a success).

use std::time::Duration;

/// A doubling delay between `initial` and `max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`; never exceeds `max` (nor goes below it if `initial > max`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay before the next retry; each call doubles the following one up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to `initial`, after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_100ms_and_stop_at_7s() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(7));
        let delays: Vec<u64> = (0..9)
            .map(|_| backoff.next_delay().as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
    }

    #[test]
    fn reset_starts_again_at_the_initial_delay() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(7));
        backoff.next_delay();
        backoff.next_delay();
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }
}

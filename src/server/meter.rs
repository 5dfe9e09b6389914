//! Generation throughput for `/health` and `/metrics`: the tokens decode steps produced in the
//! last window (a second), per second. A burst shorter than the window still shows, and an idle
//! server reads 0 once the window has passed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub struct Meter {
    window: Duration,
    /// Steps that ended within the window: when, and their tokens.
    steps: VecDeque<(Instant, u64)>,
}

impl Meter {
    pub fn new(window: Duration) -> Meter {
        Meter {
            window,
            steps: VecDeque::new(),
        }
    }

    /// Count `n` tokens of a step that ended at `now`.
    pub fn add(&mut self, now: Instant, n: u64) {
        while self
            .steps
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) >= self.window)
        {
            self.steps.pop_front();
        }
        self.steps.push_back((now, n));
    }

    /// Tokens per second at `now`: those of the steps that ended in the last window.
    pub fn rate(&self, now: Instant) -> f64 {
        let tokens: u64 = self
            .steps
            .iter()
            .filter(|&&(t, _)| now.saturating_duration_since(t) < self.window)
            .map(|&(_, n)| n)
            .sum();
        tokens as f64 / self.window.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_of_the_last_window_per_second() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let mut m = Meter::new(Duration::from_secs(1));
        assert_eq!(m.rate(t0), 0.0);
        // 8 rows every 100 ms: 80 tokens/s once a whole window is full.
        for k in 1..=10 {
            m.add(s(100 * k), 8);
        }
        assert_eq!(m.rate(s(1000)), 80.0);
        assert_eq!(m.rate(s(1050)), 80.0);
        // A window later the steps have aged out: idle reads 0.
        assert_eq!(m.rate(s(1500)), 40.0);
        assert_eq!(m.rate(s(2000)), 0.0);
        // A short burst shows for a window.
        m.add(s(60_000), 16);
        m.add(s(60_010), 16);
        assert_eq!(m.rate(s(60_500)), 32.0);
        assert_eq!(m.steps.len(), 2, "old steps are dropped");
    }
}

//! A [`Clock`] backed by `quanta` (the TSC clock governor reads), to measure what the proposed
//! fast system clock would buy the queue and the limiters (DESIGN.md 3.5: "A fast system clock
//! (e.g. `quanta`) may back `SystemClock` if a benchmark shows the std clock read dominates").
//!
//! Rows using it are labelled `(quanta clock)`; they are evidence for a core change, not a
//! shipped configuration.

use std::sync::OnceLock;

use workqueue_core::{Clock, Instant};

/// Real monotonic time read from the TSC through `quanta`, on a per-process timeline.
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    epoch: quanta::Instant,
}

impl QuantaClock {
    /// The process's quanta clock (calibrated once, on first use).
    pub fn new() -> Self {
        static CLOCK: OnceLock<QuantaClock> = OnceLock::new();
        CLOCK
            .get_or_init(|| {
                let clock = quanta::Clock::new();
                let epoch = clock.now();
                QuantaClock { clock, epoch }
            })
            .clone()
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> Instant {
        let d = self.clock.now().saturating_duration_since(self.epoch);
        Instant::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn moves_with_real_time() {
        let c = QuantaClock::new();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(20));
        let d = c.now().saturating_duration_since(a);
        assert!(
            d >= Duration::from_millis(15) && d < Duration::from_secs(2),
            "{d:?}"
        );
    }
}

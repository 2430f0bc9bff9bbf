//! Tokio's clock, as a [`Clock`] for the state machine.

use workqueue_core::{Clock, Instant};

/// Tokio's clock (`tokio::time::Instant`), measured from an epoch taken when it is created.
///
/// The async queue reads time only from tokio, so `tokio::time::pause()` and
/// `#[tokio::test(start_paused = true)]` (both need tokio's `test-util` feature) move the queue's
/// deadlines, its timers and the rate limiter's `now` on one timeline. Each queue takes its epoch when it is built
/// ([`WorkQueue::clock`](crate::WorkQueue::clock) returns it).
///
/// The clock is exact (nanoseconds, paused or not), so the queue's state sees a deadline at its
/// exact instant. tokio's timers, which wake a blocked `get`, are not: they fire on whole
/// milliseconds, at the first tick at or after the deadline.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose epoch is now, on tokio's clock.
    pub fn new() -> Self {
        TokioClock {
            epoch: tokio::time::Instant::now(),
        }
    }

    /// The tokio instant for `t`, or `None` for a deadline beyond what tokio can represent.
    pub fn to_tokio(&self, t: Instant) -> Option<tokio::time::Instant> {
        if t.is_never() {
            return None;
        }
        self.epoch.checked_add(t.as_duration())
    }

    /// The instant on this clock for a tokio instant (saturating at the epoch).
    pub fn from_tokio(&self, t: tokio::time::Instant) -> Instant {
        Instant::from_duration(t.saturating_duration_since(self.epoch))
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> Instant {
        self.from_tokio(tokio::time::Instant::now())
    }
}
